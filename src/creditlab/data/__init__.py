"""Data: the synthetic arithmetic task and its tokenizer, hub loaders into one normalised schema, verl parquet."""
