#!/usr/bin/env bash
# The SLURM plugins of the cluster environment, beside the CPU one: snakemake-executor-plugin-slurm and
# snakemake-executor-plugin-slurm-jobstep at the versions envs/cluster.txt pins (2.6.1 and 0.6.1 today), installed
# with --no-deps into their own directory (default .venv/cluster-slurm-plugins, inside the gitignored .venv).
# tests/test_slurm.py puts it first on PYTHONPATH of the processes that build each paper-scale job's `sbatch` call
# and run its job step (tests/slurm_plugins.py), so what the SLURM test cluster is handed is what those versions
# build, not what .venv's own executor plugin (2.8.0) would.
#
# Why not in .venv itself: the executor plugin 2.6.1 needs pandas < 3, .venv has 3.1.1 (and every executor plugin
# from 2.7.0 on, which .venv's numpy allows, needs numpy >= 2.4.5, which the cluster set's vLLM 0.24 refuses).
# Why --no-deps is enough: the code used (the executor's submit_string.py, utils.set_gres_string, the jobstep's
# Executor.run_job and its get_*_setting) imports only the standard library, snakemake-interface-common and
# snakemake-interface-executor-plugins, which .venv has at versions inside both plugins' requirements; pandas and
# numpy are imported by the executor's efficiency report only (pandas 3.1.1 then, outside 2.6.1's range; unused).
#
# Idempotent: nothing to do when the directory's stamp is newer than envs/cluster.txt and this script.
# SLURM_PLUGINS_FORCE=1 reinstalls. Measured: a few seconds (two pure-Python wheels).
set -euo pipefail
SCRIPT=$(readlink -f "$0")
cd "$(dirname "$SCRIPT")/.."
PIP=${PIP:-.venv/bin/pip}
DIR=${SLURM_PLUGINS_DIR:-.venv/cluster-slurm-plugins}
STAMP=$DIR/.installed
PINS=envs/cluster.txt

if [ -z "${SLURM_PLUGINS_FORCE:-}" ] && [ -e "$STAMP" ] && [ "$STAMP" -nt "$PINS" ] && [ "$STAMP" -nt "$SCRIPT" ]; then
  exit 0
fi
specs=()
for pkg in snakemake-executor-plugin-slurm snakemake-executor-plugin-slurm-jobstep; do
  spec=$(grep -oE "^${pkg}==[^[:space:]#]+" "$PINS" || true)
  if [ -z "$spec" ]; then
    echo "slurm-plugins-env: no '${pkg}==<version>' pin in $PINS" >&2
    exit 1
  fi
  specs+=("$spec")
done
rm -rf "$DIR"
"$PIP" install --quiet --no-deps --no-compile --target "$DIR" "${specs[@]}"
touch "$STAMP"
echo "slurm-plugins-env: ${specs[*]} in $DIR"
