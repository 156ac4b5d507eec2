"""Decoding: beam search, greedy search and sampling over the cached decoder; whole sets
decoded in batches."""
