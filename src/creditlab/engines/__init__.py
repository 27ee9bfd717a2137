"""Training engines: local (tiny scale, one process), verl (paper scale: the plug-in), vllm (serving)."""
