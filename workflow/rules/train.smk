rule warmup:
    input:
        data=at_scale(paths.DATA_DONE),
        tracking=rules.init_tracking.output,
    output:
        at_scale(paths.BASE_DONE),
    log:
        log_for("warmup/{backbone}"),
    priority: warmup_priority  # warm-ups first, the largest first (creditlab.resources.order)
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
    params:
        cli=CLI,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} warmup --backbone {wildcards.backbone} > {log} 2>&1'


rule train:
    input:
        base=at_scale(paths.BASE_DONE),
        tracking=rules.init_tracking.output,
    output:
        done=at_scale(paths.RUN_DONE),
        metrics=at_scale(paths.RUN_METRICS),
    log:
        log_for("train/{backbone}/{run}/s{seed}"),
    priority: train_priority  # then the runs, the most compute first: the shortest jobs end the build
    # no re-submission of a failed run (a crash fails visibly; a re-run resumes from its checkpoint): a run that outlasts
    # its allocation requeues itself before the end (creditlab.allocation), a preempted one is requeued by SLURM
    retries: 0
    conda:
        ENV
    # one core at every scale (paper: SLURM's cpus_per_task counts). A smoke job's 2 verl ranks idle most of its wall
    # time (start-up, ~85 of ~95 s, is one process at a time; a serial smoke DAG used 106% of 2 cores in CI): --cores 2
    # runs two smoke jobs at once, ~5.5 GB of memory each (measured)
    threads: 1
    resources:
        mem_mb=3000,
        runtime=train_runtime,  # minutes: the run's estimate within the site's longest job (paper), else 60
        nodes=train_nodes,  # per run (model.verl at paper scale): the SLURM profile leaves these to the rule
        gpu=train_gpus,  # the job's GPUs (sbatch --gpus): nodes x GPUs per node
        gpus=train_step_gpus,  # its job step's (srun --gpus of the jobstep plugin): the first node's
    params:
        cli=CLI,
        config=run_config_digest,  # the run's resolved config: a changed run config re-runs it
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} train --backbone {wildcards.backbone} --run {wildcards.run} --seed {wildcards.seed} > {log} 2>&1'
