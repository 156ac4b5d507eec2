"""The compile tool lowers the decoding programs the engine runs: the model prepared as the
search prepares it (kernels alone in the compute dtype), the same start and loop."""

import jax

from tests.helpers import _mesh, tiny_setup
from transformer_jax.aot import programs
from transformer_jax.decoding import search
from transformer_jax.decoding.ensemble import prepare


def _avals(lowered):
  return jax.tree_util.tree_map(lambda a: (a.shape, str(a.dtype)), lowered.args_info)


def test_the_compile_tools_beam_programs_are_the_engines_in_bfloat16():
  cfg, model, state = tiny_setup(**{"model.dtype": "bfloat16"})
  tool = {p.name: p for p in programs.beam_programs(cfg, _mesh())}
  engine = prepare(model, state.params)
  rows, S = cfg.decode.batch_size, cfg.data.max_source_length  # (one device)
  inputs = jax.numpy.zeros((rows, S), jax.numpy.int32)
  caps = jax.numpy.zeros((rows,), jax.numpy.int32)
  start = search.beam_start.lower(engine, inputs, caps, None, beam_size=cfg.decode.beam_size,
                                  beam_impl=cfg.decode.beam_impl)
  assert _avals(tool["beam_start"].lower()) == _avals(start)
  state = start.compile().out_info
  loop = search.beam_loop.lower(engine, state, alpha=cfg.decode.length_penalty, num_return=1,
                                min_len=0, stop_at=0)
  assert _avals(tool["beam_loop"].lower()) == _avals(loop)
  # (the same programs: what differs between them is where the parameters are placed)
  strip = lambda text: "\n".join(l.split(" {mhlo.sharding")[0] for l in text.splitlines())
  assert strip(tool["beam_loop"].lower().as_text()) == strip(loop.as_text())
