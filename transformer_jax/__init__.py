"""A JAX/Flax sequence-to-sequence Transformer toolkit.

Importing it leaves an absent TPU out of JAX's backends (`parallel.platforms`), before any
backend starts: every entry point (the tools, train.py, the benchmarks, `python -m`, a
notebook) starts quietly where the `tpu` extra is installed on a machine without TPU chips."""

from transformer_jax.parallel import platforms as _platforms

_platforms.leave_out_absent_tpu()
