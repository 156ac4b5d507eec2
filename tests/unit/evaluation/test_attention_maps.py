"""Attention maps of a trained run: rows are distributions over what is visible, hidden cells get
exactly zero weight; the heatmaps and the tool that draws them."""

import numpy as np

from tests import helpers
from transformer_jax.cli import attention_maps as attention_cli
from transformer_jax.evaluation import attention_maps
from transformer_jax.inference import trained_run
from transformer_jax.inference.trained_run import Selected


def test_attention_maps_rows_sum_to_one_and_masked_cells_are_zero(tiny_run, tmp_path):
  run = trained_run.load(tiny_run)
  params = run.params(Selected("step_20", [20]))
  tok = run.tokenizer
  src, tgt = tok.encode("Ein Mann fährt Fahrrad."), tok.encode("A man rides a bike.")
  weights = attention_maps.attention_weights(run.model, params, src, tgt)
  for kind, layers in weights.items():
    assert len(layers) == 2
    for w in layers:
      np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
      if kind == "decoder_self_attention":  # future positions get exactly zero weight
        T = w.shape[-1]
        assert np.all(w[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)
  # With padding after the sentence, the padded keys get exactly zero weight.
  padded_src = np.concatenate([src, [0, 0, 0]])
  w = attention_maps.attention_weights(run.model, params, padded_src, tgt)
  for kind in ("encoder_self_attention", "cross_attention"):
    for layer in w[kind]:
      real_rows = layer[:, :len(src) if kind.startswith("encoder") else len(tgt)]
      assert np.all(real_rows[..., len(src):] == 0.0)
      np.testing.assert_allclose(real_rows.sum(-1), 1.0, atol=1e-5)
  paths = attention_maps.plot_attention(weights, tok.pieces(src), tok.pieces(tgt), tmp_path)
  assert len(paths) == 6 and all(p.stat().st_size > 1000 for p in paths)
  # Longer than the model's positions: cut there, as decoding cuts (rotary's table ends there).
  max_len = run.model.config.max_len
  long_src, long_tgt = list(src) * (max_len // len(src) + 1), list(tgt) * (max_len // len(tgt) + 1)
  w = attention_maps.attention_weights(run.model, params, long_src, long_tgt)
  assert w["cross_attention"][0].shape[1:] == (max_len, max_len)
  assert all(np.isfinite(layer).all() for layers in w.values() for layer in layers)



def test_the_attention_maps_tool_draws_every_layer_and_kind(tiny_run, tmp_path):
  status, out, err = helpers.run_tool(attention_cli.main, f"--workdir={tiny_run}",
                                      "--sentence=Ein Mann fährt Fahrrad.",
                                      f"--output_dir={tmp_path}")
  assert status == 0, err[-2000:]
  assert out.startswith("source: Ein Mann fährt Fahrrad.\ntranslation: ")
  assert len(list(tmp_path.glob("*_layer*.png"))) == 6
  status, _, err = helpers.run_tool(attention_cli.main, f"--workdir={tiny_run}", "--sentence= ")
  assert status == 2 and "--sentence is empty" in err
