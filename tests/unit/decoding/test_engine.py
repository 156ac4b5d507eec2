"""What the decoding engine tells about the machine it decodes on."""

import logging

from transformer_jax.decoding import engine


def test_a_cpu_with_a_jaxlib_of_the_loop_write_regression_is_told_so_once(caplog):
  with caplog.at_level(logging.WARNING, logger=engine.log.name):
    engine.note_loop_write_regression("cpu", "0.10.2")   # before the regression
    engine.note_loop_write_regression("gpu", "0.12.1")   # XLA:CPU's only
    engine.note_loop_write_regression("cpu", "0.11.91")  # (a version no other test meets)
    engine.note_loop_write_regression("cpu", "0.11.91")  # once
  said = [r.getMessage() for r in caplog.records]
  assert len(said) == 1 and said[0].startswith("jaxlib 0.11.91 on a CPU")
  assert "jax #40101" in said[0] and "benchmarks/dus_regression.py" in said[0]
