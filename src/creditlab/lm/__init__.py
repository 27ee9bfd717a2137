"""Language-model primitives shared by the engines, decoding, evaluation and the analyses: token batches with the
per-token forward (:mod:`creditlab.lm.batch`) and the batched KV-cache sampler (:mod:`creditlab.lm.sampler`).

A layer of its own below ``analysis`` (docs/design-notes.md): they were ``engines/local/{batch,sampler}.py``, which
made decoding, eval and analysis import an engine. Nothing here imports another creditlab layer.
"""
