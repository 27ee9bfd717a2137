"""Models: the tiny models, random-init stand-ins of the paper backbones, per-scale weight sources."""
