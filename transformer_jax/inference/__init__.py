"""Inference: a trained run loaded from its workdir and put to use: translating, scoring its
checkpoints, averaging them."""
