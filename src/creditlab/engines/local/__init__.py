"""The local engine: the GRPO/DAPO trainer that runs every method at tiny scale (trainer.py), SFT, LoRA."""
