"""Entry point of a creditlab run on verl: ``python -m creditlab.engines.verl.main <hydra overrides>``.

verl 0.9.1's ``verl.trainer.main_ppo`` with our pieces in:
  * Hydra composes verl's own ``ppo_trainer`` config (``pkg://verl.trainer.config``) with the launcher's
    overrides, which include ``plugin.plugin_overrides(run_cfg)`` and ``+creditlab.config_path=<yaml>``;
  * :func:`prepare` exports the run config path (``CREDITLAB_RUN_CONFIG``) and the plug-in module
    (``VERL_USE_EXTERNAL_MODULES``) to every Ray process through ``ray_kwargs.ray_init.runtime_env``, so
    each verl process imports ``creditlab.engines.verl.plugin`` (losses, advantage estimators) and reads
    the same method settings;
  * :class:`CreditlabTaskRunner` is verl's ``TaskRunnerV1`` that first imports
    ``creditlab.engines.verl.trainer`` (registering ``trainer.v1.trainer_mode=creditlab_sync``: our trainer,
    which brings our worker class), then runs verl's V1 loop unchanged.
Then verl's own ``auto_set_device``, ``validate_config`` and ``run_ppo``.
"""

from __future__ import annotations

import os

PLUGIN_MODULE = "creditlab.engines.verl.plugin"


def _with_plugin(value: str | None) -> str:
    """``VERL_USE_EXTERNAL_MODULES`` with our plug-in module in it (comma-separated list)."""
    mods = [m for m in (value or "").split(",") if m]
    return ",".join(mods if PLUGIN_MODULE in mods else [*mods, PLUGIN_MODULE])


# before verl is imported: verl's __init__ imports the listed modules
os.environ["VERL_USE_EXTERNAL_MODULES"] = _with_plugin(os.environ.get("VERL_USE_EXTERNAL_MODULES"))

import hydra  # noqa: E402
import ray  # noqa: E402
from omegaconf import DictConfig, OmegaConf, open_dict  # noqa: E402
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import validate_config  # noqa: E402
from verl.utils.device import auto_set_device  # noqa: E402

from creditlab.algos.plugins import ENV_MODULES  # noqa: E402
from creditlab.allocation import ENV_DEADLINE, ENV_EXIT_GRACE  # noqa: E402
from creditlab.engines.verl import plugin as _plugin  # noqa: E402
from creditlab.engines.verl.plugin import ENV_RUN_CONFIG, TRAINER_MODE, run_config  # noqa: E402

assert _plugin.PLUGIN_MODULE == PLUGIN_MODULE
FORWARDED_ENV = (
    "VERL_USE_EXTERNAL_MODULES",
    ENV_MODULES,
    ENV_RUN_CONFIG,
    "PYTHONPATH",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "VERL_PLATFORM",
    "VERL_ENGINE_DEVICE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    ENV_DEADLINE,
    ENV_EXIT_GRACE,
)
"""Environment variables every Ray worker must see (set in the job's runtime_env)."""


@ray.remote
class CreditlabTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 task runner, with creditlab's trainer registered before verl looks the trainer mode up."""

    def run(self, config: DictConfig):
        import creditlab.engines.verl.trainer  # noqa: F401 - registers trainer_mode creditlab_sync

        return super().run(config)


def prepare(config: DictConfig) -> dict:
    """Check that ``config`` selects our plug-in, export the run config to this process and to Ray's workers.

    config: verl's composed config (with ``creditlab.config_path``). Returns the run config (dict).
    Raises ValueError when the path is missing or the plug-in overrides were not applied.
    """
    path = OmegaConf.select(config, "creditlab.config_path")
    if not path:
        raise ValueError("missing +creditlab.config_path=<resolved run config YAML> (the launcher writes it)")
    path = os.path.abspath(str(path))
    run_cfg = run_config(path)
    os.environ[ENV_RUN_CONFIG] = path
    if config.trainer.v1.trainer_mode != TRAINER_MODE or not config.trainer.use_v1:
        raise ValueError(
            f"trainer.v1.trainer_mode must be {TRAINER_MODE!r} with trainer.use_v1=true: append "
            "creditlab.engines.verl.plugin.plugin_overrides(run_cfg) to the overrides"
        )
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    with open_dict(config):
        rt = config.ray_kwargs.ray_init.runtime_env
        rt.env_vars = {**(OmegaConf.to_container(rt.env_vars) if rt.get("env_vars") else {}), **env}
    return run_cfg


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """verl's ``main_ppo.main`` with :func:`prepare` first and :class:`CreditlabTaskRunner` as the runner."""
    prepare(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=CreditlabTaskRunner)


if __name__ == "__main__":
    main()
