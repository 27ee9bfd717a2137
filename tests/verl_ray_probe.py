"""A multi-node paper-scale run's launch, for real up to verl's `ray.init`, then a probe instead of verl's trainer
(tests/test_slurm.py, inside a two-node SLURM job on the test cluster).

    python tests/verl_ray_probe.py launch BACKBONE RUN SEED RESULTS PORT   # in the job step, as `creditlab train`
    python -m verl_ray_probe <verl overrides>                             # the driver it starts (tests/ on PYTHONPATH)

`launch` does what `creditlab.jobs.train.train_verl` does up to verl (the run's resolved config written where the
plug-in reads it, `launch.verl_command(cfg, paths, num_cpus=slurm_cpus(), ...)` with the plug-in's own overrides,
`launch.run_streaming`), with two changes to the command: the Ray head's port is a free one (`--port`, the default
6379 may be taken on a shared machine) and the driver module is this one instead of creditlab.engines.verl.main.

The driver is creditlab.engines.verl.main's own entry (`main.main()`: Hydra composes verl's `ppo_trainer` with the
launcher's overrides; `prepare`, `auto_set_device`, `validate_config`, verl's `run_ppo`, whose `ray.init(**kwargs)`
builds its arguments from `ray_kwargs.ray_init` and verl's runtime env), with `ray.init` recorded on its way through
and verl's task runner replaced by a probe actor: it reports the Ray cluster it finds (nodes, their CPUs and GPUs,
the SLURM node and step GPUs each node's Ray processes run with) and the runtime env its process got. The reports go
next to the run's config file (`ray_driver.json`, `ray_probe.json`); `launch.json` holds the launcher's command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PAPERS = ["dlogp", "delta", "dfpo", "cancellation", "arca"]
DRIVER = "verl_ray_probe"


def launch_run(backbone: str, run_name: str, seed: str, results: str, port: str) -> None:
    import yaml

    from creditlab.engines.verl import launch
    from creditlab.jobs.train import slurm_cpus
    from creditlab.plan import build_plan, run_config

    plan = build_plan({"scale": "paper", "papers": PAPERS, "seeds": [int(seed)], "results": results}, validate=False)
    cfg = run_config(plan.get(backbone, run_name, int(seed)))
    paths = launch.RunPaths.of(cfg, results, model_path=f"/models/{backbone}")  # never loaded: no model is built
    paths.config_path.parent.mkdir(parents=True, exist_ok=True)
    paths.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    argv, env = launch.verl_command(cfg, paths, num_cpus=slurm_cpus())
    ours = list(argv)
    assert argv[1:3] == ["-m", launch.RAY_SLURM] and launch.VERL_MAIN in argv, argv[:12]
    argv[argv.index(launch.VERL_MAIN)] = DRIVER
    argv[3:3] = ["--port", port, "--timeout", "240"]
    out = paths.config_path.parent
    (out / "launch.json").write_text(json.dumps({"argv": ours, "env": env, "slurm_cpus": slurm_cpus()}))
    sys.exit(launch.run_streaming(argv, env, cwd=out))


def drive() -> None:
    import ray

    import creditlab.engines.verl.main as entry

    record: dict = {"RAY_ADDRESS": os.environ.get("RAY_ADDRESS"), "SLURMD_NODENAME": os.environ.get("SLURMD_NODENAME")}
    real_init = ray.init

    def init(*args, **kwargs):
        record["ray_init_args"], record["ray_init_kwargs"] = list(args), kwargs
        try:
            result = real_init(*args, **kwargs)
        except Exception as err:
            record["ray_init_error"] = f"{type(err).__name__}: {err}"
            raise
        record["gcs_address"] = ray.get_runtime_context().gcs_address
        return result

    ray.init = init

    @ray.remote(num_cpus=1)
    class Probe:
        def run(self, config):
            @ray.remote(num_cpus=0)
            def where():
                return {k: os.environ.get(k) for k in ("SLURMD_NODENAME", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")}

            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            nodes = [n for n in ray.nodes() if n["Alive"]]
            on = ray.get(
                [
                    where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                    for n in nodes
                ]
            )
            report = {
                "nodes": [
                    {"CPU": n["Resources"].get("CPU"), "GPU": n["Resources"].get("GPU"), **o}
                    for n, o in zip(nodes, on, strict=True)
                ],
                "actor_env": {
                    k: os.environ.get(k)
                    for k in ("VERL_USE_EXTERNAL_MODULES", "CREDITLAB_RUN_CONFIG", "TOKENIZERS_PARALLELISM")
                },
            }
            Path(config.creditlab.config_path).with_name("ray_probe.json").write_text(json.dumps(report))

    entry.CreditlabTaskRunner = Probe  # main.main() -> run_ppo(config, task_runner_class=CreditlabTaskRunner)
    config_path = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("+creditlab.config_path="))
    try:
        entry.main()
    except BaseException as err:
        record["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        Path(config_path).with_name("ray_driver.json").write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    if sys.argv[1:2] == ["launch"]:
        launch_run(*sys.argv[2:])
    else:
        drive()
