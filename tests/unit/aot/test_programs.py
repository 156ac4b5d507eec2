"""The compile tool lowers the decoding programs the engine runs, by asking the engine for
them: the model prepared as the search prepares it (kernels alone in the compute dtype, the
output matrix prepared), the same in-flight advance and its loop-free step."""

import jax

from tests.helpers import _mesh, tiny_setup
from transformer_jax.aot import programs
from transformer_jax.decoding.engine import SearchEngine
from transformer_jax.decoding.ensemble import prepare


def _avals(lowered):
  return jax.tree_util.tree_map(lambda a: (a.shape, str(a.dtype)), lowered.args_info)


def _products(text: str) -> list[str]:
  """The program's matrix products, operand and result types (the compute dtype's rules)."""
  return sorted(line.split(" : ", 1)[1] for line in text.splitlines() if "dot_general" in line)


def test_the_compile_tools_beam_programs_are_the_engines_in_bfloat16():
  cfg, model, state = tiny_setup(**{"model.dtype": "bfloat16"})
  tool = {p.name: p for p in programs.beam_programs(cfg, _mesh())}
  engine = SearchEngine(prepare(model, state.params), None, cfg.decode)
  width_class = engine.decoder().geometry.class_of(cfg.data.max_source_length)
  ours = engine.programs(width_class)
  assert list(tool) == ["beam_advance"]
  assert _avals(tool["beam_advance"].lower()) == _avals(ours["advance"]())
  assert _avals(tool["beam_advance"].twin()) == _avals(ours["step"]())
  # (the same products in the same dtypes; what differs is where the arrays are placed)
  assert (_products(tool["beam_advance"].lower().as_text())
          == _products(ours["advance"]().as_text()))
  assert _products(tool["beam_advance"].twin().as_text()) == _products(ours["step"]().as_text())


def test_the_compile_tool_lowers_what_a_set_runs_not_a_server_s_every_option():
  """The default settings ask for no repetition rule and no sampling: the tool's advance is
  the lean one validation and `evaluate` run (without the rules' `cond`), not the server's,
  whose slots keep every option."""
  cfg, model, state = tiny_setup()
  tool = programs.beam_programs(cfg, _mesh())[0]
  engine = SearchEngine(prepare(model, state.params), None, cfg.decode)
  server = engine.programs(0, server=True)["advance"]().as_text()
  assert server.count("stablehlo.case") == 1
  assert tool.lower().as_text().count("stablehlo.case") == 0
