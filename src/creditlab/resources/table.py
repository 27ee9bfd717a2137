"""The plan's resource tables: one line per planned verl run (memory, hours, disk) and per evaluation job (hours),
with their totals."""

from __future__ import annotations

from collections.abc import Mapping

from creditlab.resources.estimate import Cluster, RunResources
from creditlab.resources.eval_time import EVAL_JOB_MARGIN, EVAL_STARTUP_MINUTES, EvalResources, eval_job_minutes

HEADER = (
    f"{'run':52s} {'GPUs':>4s} {'GB/GPU':>7s} {'phase':14s} {'host GB/node':>12s} {'h/step':>7s} {'hours':>7s} "
    f"{'h worst':>8s} {'ckpt TB':>7s} {'credit':9s} fits"
)


def resource_lines(
    resources: Mapping[str, RunResources],
    cluster: Cluster,
    refused: Mapping[str, str] | None = None,
    hub_bytes: float | None = None,
) -> list[str]:
    """The table (a header, one line per run, sorted by key) and the totals: GPU-hours, the disk every run's peak
    takes together (what ``cluster.disk_tb`` must hold if they all ran at once) and after pruning (final/ and one
    checkpoint each), the hub cache (``hub_bytes``, creditlab.models.hub_cache) when given. ``refused``: run key ->
    reason (the plan's refused runs), marked in the table."""
    refused = refused or {}
    out = [
        f"resources on a cluster of {cluster.gpu_mem_gb:.0f} GB GPUs ({cluster.gpu_budget_gb:.0f} GB usable), "
        f"{cluster.host_mem_gb:.0f} GB per node, {cluster.peak_tflops:.0f} TFLOP/s at MFU {cluster.train_mfu:.2f} "
        f'(train) / {cluster.gen_mfu:.2f} (generation); docs/cluster.md "Resources"',
        HEADER,
    ]
    gpu_hours = disk = kept = 0.0
    for key in sorted(resources):
        r = resources[key]
        mark = "yes" if r.fits and key not in refused else ("NO" if not r.fits else "refused")
        out.append(
            f"{key:52s} {r.gpus:4d} {r.gpu_mem_gb_per_rank:7.1f} {r.peak_phase:14s} {r.host_mem_gb_per_node:12.0f} "
            f"{r.hours_per_step:7.3f} {r.hours:7.1f} {r.hours_max:8.1f} {r.checkpoint_tb:7.2f} "
            f"{r.credit_pass or '-':9s} {mark}"
        )
        if key in refused:
            continue
        gpu_hours += r.gpus * r.hours
        disk += r.checkpoint_tb
        kept += r.kept_tb
    hub = f"; hub cache {hub_bytes / 1e12:.2f} TB" if hub_bytes is not None else ""
    over = f" > the cluster's {cluster.disk_tb:.0f} TB: prune or run fewer at once" if disk > cluster.disk_tb else ""
    out.append(
        f"totals (runs not refused): {gpu_hours:,.0f} GPU-hours expected; disk {disk:.1f} TB if every run held its "
        f"checkpoints at once{over}, {kept:.1f} TB once pruned (final/ + the last checkpoint){hub}"
    )
    return out


EVAL_HEADER = (
    f"{'evaluation job':66s} {'GPUs':>4s} {'sequences':>9s} {'Mtok':>7s} {'at once':>7s} {'gen h':>6s} "
    f"{'judge h':>7s} {'hours':>6s} {'wall min':>8s} fits"
)


def eval_lines(
    evals: Mapping[str, EvalResources], cluster: Cluster, refused: Mapping[str, str] | None = None
) -> list[str]:
    """The evaluation jobs' table (creditlab.resources.eval_time: a header, one line per job, sorted by key: its
    GPUs, sequences, expected response tokens, sequences decoded at once, generation and judging hours, the SLURM
    wall time the rule asks for) and their total GPU-hours, then the jobs' notes; ``refused``: job key -> reason (the
    plan's refused evaluations, marked). Empty without evaluations."""
    if not evals:
        return []
    refused = refused or {}
    out = [
        f"evaluation jobs (vLLM at {cluster.decode_step_s * 1e3:.0f} ms per decode step, judging on "
        f"{max(1, int(cluster.eval_cores) - 1)} workers; the rules' wall time: {EVAL_JOB_MARGIN} x hours + "
        f'{EVAL_STARTUP_MINUTES} min, at most {cluster.site_max_hours:.0f} h); docs/cluster.md "Resources"',
        EVAL_HEADER,
    ]
    gpu_hours = 0.0
    for key in sorted(evals):
        r = evals[key]
        mark = "NO" if key in refused else "yes"
        out.append(
            f"{key:66s} {r.gpus:4d} {r.sequences:9,d} {r.tokens / 1e6:7.1f} {r.concurrency:7d} {r.gen_hours:6.1f} "
            f"{r.judge_hours:7.2f} {r.hours:6.1f} {eval_job_minutes(r, cluster):8d} {mark}"
        )
        if key not in refused:
            gpu_hours += r.gpus * r.hours
    out.append(f"evaluation totals (jobs not refused): {gpu_hours:,.0f} GPU-hours expected")
    notes: dict[str, list[str]] = {}
    for key in sorted(evals):
        for note in evals[key].notes:
            notes.setdefault(note, []).append(key)
    for note, keys in notes.items():
        out.append(f"note ({keys[0]}" + (f" and {len(keys) - 1} more" if len(keys) > 1 else "") + f"): {note}")
    return out
