"""The verl engine: creditlab's plug-in, ordering, samplers, trainer, workers and launcher for verl 0.9.1."""
