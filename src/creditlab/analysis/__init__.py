"""Post-hoc analyses of RL updates (token values, flipping, coupling)."""
