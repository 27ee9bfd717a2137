"""Issue 28, suspected item (e): a single-node run's ``ray.init()`` joining a stale Ray cluster on a shared node.

verl 0.9.1's ``main_ppo.run_ppo`` calls ``ray.init(**config.ray_kwargs.ray_init)`` (trainer/main_ppo.py:56-74); verl's
config has no ``address`` there (trainer/config/ppo_trainer.yaml:509-520), so Ray's default applies: with
``address=None`` Ray uses ``RAY_ADDRESS`` if set, else the last ``ray start``'s address in
``<temp dir>/ray_current_cluster`` (/tmp/ray by default, per machine, left by any user's or job's earlier cluster), and
starts a new instance only if neither exists (ray 2.60 _private/services.py:413-465, 686-720; _private/worker.py
1686-1694, 1838). On one node the launcher also passes ``num_cpus``, which Ray refuses when it connects to an existing
cluster: a node where an earlier job left ray_current_cluster fails at start (or, without num_cpus, would join
someone else's cluster). ``address="local"`` always starts a new instance and ignores RAY_ADDRESS (services.py:707,
worker.py:1689). This machine itself had such a file when this was written (another process's ``ray start``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROBE = r"""
import os, sys, pathlib
import ray
tmp, address = sys.argv[1], sys.argv[2]
pathlib.Path(tmp, "ray_current_cluster").write_text("127.0.0.1:9")  # a stale cluster's address: nothing listens
kw = dict(num_cpus=1, _temp_dir=tmp, include_dashboard=False, logging_level="ERROR")
if address != "none":
    kw["address"] = address
try:
    ray.init(**kw)
except Exception as e:
    print("RESULT refused", type(e).__name__, e)
    sys.exit(0)
print("RESULT started", ray.get_runtime_context().gcs_address != "127.0.0.1:9")
ray.shutdown()
"""


def _init(address: str, ray_address: str | None = None) -> str:
    import os

    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    tmp = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # short: Ray's unix sockets live under it (107 bytes at most)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, tmp, address], capture_output=True, text=True, timeout=240, env=env
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), "")
    assert line, (proc.stdout + proc.stderr)[-3000:]
    return line


def test_verls_bare_ray_init_joins_a_stale_cluster_and_refuses_num_cpus():
    """What verl's run_ppo does on one node today (ray_init without address, with the launcher's num_cpus), on a
    machine where an earlier cluster left its address: Ray tries to join it and refuses num_cpus."""
    line = _init("none")
    assert "refused ValueError" in line and "existing cluster" in line, line


def test_address_local_starts_a_fresh_instance_whatever_was_left():
    """``address="local"`` starts a new Ray instance with num_cpus, stale ray_current_cluster and RAY_ADDRESS
    notwithstanding: what single-node paper runs should pass (+ray_kwargs.ray_init.address=local)."""
    assert _init("local", ray_address="127.0.0.1:9") == "RESULT started True"


def test_verls_config_takes_the_address_key():
    """``+ray_kwargs.ray_init.address=local`` composes with verl's own Hydra config (the key is new there: '+')."""
    verl = pytest.importorskip("verl")
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        conf = compose(config_name="ppo_trainer", overrides=["+ray_kwargs.ray_init.address=local"])
    assert conf.ray_kwargs.ray_init.address == "local" and "num_cpus" in conf.ray_kwargs.ray_init
