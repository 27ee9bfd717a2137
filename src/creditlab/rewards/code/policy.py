"""Which sandbox tier may score code here: the tier probed where the job runs, refused or accepted, and its record.

A code result is only as trustworthy as the sandbox that ran it (:mod:`creditlab.rewards.code.sandbox`): ``bwrap``
isolates the filesystem and the network; ``unshare`` isolates the network but not the filesystem (the solution reads
what the job reads, and as a non-root caller writes what the job may write: the results); ``process`` isolates
neither; ``none`` cannot run code at all (every test would be a ``sandbox_error``, scored 0).

:func:`code_sandbox` probes the tier in the calling process (the job, on the node it runs on) and decides:

* ``none``: refused at every scale (:class:`SandboxRefused`): a job that scores code must not turn every answer
  into a silent 0.
* at paper scale, any tier weaker than :data:`ISOLATING`: refused with the reason and what to install, unless
  accepted in words: env :data:`ACCEPT_ENV` (the pipeline config's ``code_sandbox_accept``, exported to every job)
  set to the tier's phrase in :data:`ACCEPT_PHRASES` (accepting ``process`` accepts ``unshare`` too).
* otherwise: allowed.

The returned record (tier, whether it isolates, the accepted phrase, the probe's notes) goes with every code
result: each code suite's block of an evaluation's metrics.json, the table cells read from it and the ledger.
"""

from __future__ import annotations

import os
from typing import Any

from creditlab.rewards.code.sandbox import get_plan

ISOLATING = ("bwrap",)
"""Tiers with filesystem and network isolation: what paper-scale code results are scored under by default."""

ORDER = ("bwrap", "unshare", "process", "none")
"""Tiers from the strongest to the weakest."""

ACCEPT_ENV = "CREDITLAB_CODE_SANDBOX_ACCEPT"
"""Environment variable (set from the pipeline config's ``code_sandbox_accept``) that accepts a weaker tier."""

ACCEPT_PHRASES = {
    "unshare": "unshare without filesystem isolation",
    "process": "process without filesystem or network isolation",
}
"""The words that accept a weaker tier at paper scale, exactly (accepting one accepts every stronger tier)."""

INSTALL_HINT = (
    "install bubblewrap on the compute nodes (Debian/Ubuntu: apt install bubblewrap; RHEL/Rocky: dnf install "
    "bubblewrap) and allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; Ubuntu >= 23.10 also "
    "kernel.apparmor_restrict_unprivileged_userns=0), and keep the interpreter world-readable; check with "
    "`python -c 'from creditlab.rewards.code.sandbox import sandbox_report as r; print(r())'` on a compute node"
)


class SandboxRefused(RuntimeError):
    """Code cannot be scored here under the sandbox tier this machine offers."""


def accepted_tier(phrase: str | None) -> str | None:
    """The weakest tier ``phrase`` accepts (None: none accepted); ValueError naming the valid phrases otherwise."""
    if phrase is None or not str(phrase).strip():
        return None
    for tier, words in ACCEPT_PHRASES.items():
        if str(phrase).strip() == words:
            return tier
    raise ValueError(
        f"code_sandbox_accept must be one of {list(ACCEPT_PHRASES.values())} (the tier and what it lacks, "
        f"in these words), got {phrase!r}"
    )


def code_sandbox(scale: str | None, accept: str | None = None) -> dict[str, Any]:
    """Probe this process's sandbox tier and decide whether code may be scored under it at ``scale``.

    accept: the acceptance phrase (default: env :data:`ACCEPT_ENV`). Returns the record ``{tier, isolating,
    accepted, interpreter, notes}``; raises :class:`SandboxRefused` (with the reason and what to install) for tier
    ``none`` at any scale and for a tier weaker than :data:`ISOLATING` at paper scale unless accepted.
    """
    phrase = os.environ.get(ACCEPT_ENV) if accept is None else accept
    weakest = accepted_tier(phrase)
    plan = get_plan()
    record = {
        "tier": plan.tier,
        "isolating": plan.tier in ISOLATING,
        "accepted": None,
        "interpreter": plan.interpreter,
        "notes": plan.error,
    }
    if plan.tier == "none":
        raise SandboxRefused(
            f"no sandbox can run code on this machine ({plan.error}); scoring would turn every code answer into "
            f"a sandbox_error scored 0, so the job stops instead: {INSTALL_HINT}"
        )
    if plan.tier in ISOLATING or scale != "paper":
        return record
    if weakest is not None and ORDER.index(plan.tier) <= ORDER.index(weakest):
        record["accepted"] = ACCEPT_PHRASES[weakest]
        return record
    raise SandboxRefused(
        f"the code sandbox here is tier {plan.tier!r} ({ACCEPT_PHRASES.get(plan.tier, plan.tier)}; probe: "
        f"{plan.error or 'bwrap not chosen'}): paper-scale code results are scored under {' or '.join(ISOLATING)} "
        f"only. Either {INSTALL_HINT}; or accept this tier in words: pipeline config code_sandbox_accept="
        f"{ACCEPT_PHRASES[plan.tier]!r} (env {ACCEPT_ENV} for a job run by hand)"
    )
