# Sourced by tools/sysdeps.sh: Debian packages of the local one-node SLURM cluster that tests/test_slurm.py starts
# (tests/slurm_cluster.py) to run the micro DAG through workflow/profiles/slurm. Without them that test fails.
#   slurmctld      controller daemon      (Debian 12: 22.05.8; slurm-wlm = slurmctld + slurmd + slurm-client)
#   slurmd         node daemon (runs the jobs)
#   slurm-client   sbatch, srun, squeue, sinfo, scontrol, scancel (what the executor plugin calls)
#   munge          authentication daemon munged (+ munge, unmunge); the test starts its own with its own key
# The daemons are in /usr/sbin, which is not on a non-root PATH: checked by full path.
# The test starts and stops its own daemons (own munge key and socket, own slurm.conf via SLURM_CONF, free ports):
# on a systemd host the packages' slurmd/slurmctld services stay inactive (no /etc/slurm/slurm.conf), and a
# system munged, if the munge service starts one, is left alone.
NEED+=(
  [/usr/sbin/slurmctld]=slurmctld
  [/usr/sbin/slurmd]=slurmd
  [sbatch]=slurm-client
  [/usr/sbin/munged]=munge
)
