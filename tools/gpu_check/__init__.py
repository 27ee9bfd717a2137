"""The GPU acceptance check of creditlab (``python tools/gpu_check``; ``__main__`` says what it runs).

Modules: ``methods`` (check 1: registered methods and method configs, bf16 vs CPU float64), ``engine`` (check 2:
the local engine's SFT, sampler and RL steps in bf16), ``verl_side`` (check 3: what of the verl engine imports and
runs without verl and Ray), ``compare`` (error measures, tolerances), ``configs`` (run configs without Hydra),
``isolation`` (hide packages the device image lacks), ``report`` (JSON and markdown).
"""
