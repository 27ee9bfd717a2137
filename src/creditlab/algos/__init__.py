"""The methods: pure PyTorch functions on tensors (advantages, policy losses, credit weights, token filters,
batching), registered by name so that configs pick them (:mod:`creditlab.algos.registry`).

Registration is here, on purpose: this ``__init__`` imports every module that registers methods, so that any import
under ``creditlab.algos`` (the registry included: Python runs this file first) sees all of them. A new method module
is added to the imports below. Methods of other installed packages (entry points of the group ``creditlab.methods``,
modules named in ``$CREDITLAB_METHOD_MODULES``) are imported last (:mod:`creditlab.algos.plugins`;
docs/add-a-method.md). Rewards and decoding criteria have their own registries (:mod:`creditlab.rewards.registry`,
:mod:`creditlab.decoding.criteria`).
"""

from creditlab.algos import advantages, batching, credit, losses  # noqa: F401  (register their methods)
from creditlab.algos.plugins import load_plugins

load_plugins()  # methods of other installed packages (entry points `creditlab.methods`, $CREDITLAB_METHOD_MODULES)
