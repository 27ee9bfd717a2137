"""Evaluation: sampling a model on a suite and scoring it (greedy, avg@k, pass@k per suite)."""
