"""The compile tool lowers the decoding programs the engine runs, by asking the engine for
them: the model prepared as the search prepares it (kernels alone in the compute dtype), the
same start and loop."""

import jax
import jax.numpy as jnp

from tests.helpers import _mesh, tiny_setup
from transformer_jax.aot import programs
from transformer_jax.decoding.engine import SearchEngine
from transformer_jax.decoding.ensemble import prepare


def _avals(lowered):
  return jax.tree_util.tree_map(lambda a: (a.shape, str(a.dtype)), lowered.args_info)


def _unplaced(text: str) -> str:
  return "\n".join(line.split(" {mhlo.sharding")[0] for line in text.splitlines())


def test_the_compile_tools_beam_programs_are_the_engines_in_bfloat16():
  cfg, model, state = tiny_setup(**{"model.dtype": "bfloat16"})
  tool = {p.name: p for p in programs.beam_programs(cfg, _mesh())}
  rows, S = cfg.decode.batch_size, cfg.data.max_source_length  # (one device)
  engine = SearchEngine(prepare(model, state.params), None, cfg.decode).beam_programs(
      jnp.zeros((rows, S), jnp.int32), jnp.zeros((rows,), jnp.int32))
  assert _avals(tool["beam_start"].lower()) == _avals(engine["start"]())
  assert _avals(tool["beam_loop"].lower()) == _avals(engine["loop"]())
  # (the same programs: what differs between them is where the parameters are placed)
  assert _unplaced(tool["beam_loop"].lower().as_text()) == _unplaced(engine["loop"]().as_text())
