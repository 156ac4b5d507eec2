"""The CTranslate2 spec built from our parameters computes our model: for every option this
codebase has (pre-/post-LN, LayerNorm/RMSNorm and their epsilon, each feed-forward activation,
sinusoidal (both layouts), learned, rotary and relative positions, shared/tied/unscaled
embeddings, an output bias, grouped- and multi-query attention, QK-norm, scanned layers, unequal
stacks: the shared variants of tests/model_variants.py),
CTranslate2's log-probabilities of a target equal our teacher-forced ones."""

import ctranslate2
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from tests.model_variants import VARIANTS
from transformer_jax.data.tokenizer import PAD_ID, Tokenizer
from transformer_jax.interop import ctranslate2_model
from transformer_jax.model.transformer import Transformer, unscanned

PAIRS = [("Ein Mann fährt mit dem Fahrrad durch die Stadt.", "A man rides a bike."),
         ("Zwei kleine Hunde spielen im tiefen Schnee auf einer großen Wiese neben dem Wald "
          "und ein Kind schaut ihnen zu.", "Two dogs play in the snow."),
         ("Hallo", "Hello there, how are you doing today?")]


def _padded(rows):
  width = max(map(len, rows))
  return jnp.array([row + [0] * (width - len(row)) for row in rows])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_ctranslate2_scores_targets_as_our_model_does(name, tiny_tokenizer, tmp_path):
  cfg = helpers.tiny_train_config(**VARIANTS[name])
  model = Transformer(cfg.model)
  tokenizer = Tokenizer.load(tiny_tokenizer)
  x = _padded([tokenizer.encode(s) for s, _ in PAIRS])
  y = _padded([tokenizer.encode(t) for _, t in PAIRS])
  # Random weights of every shape the model has (norm scales about 1, everything else about
  # 0.2: no weight left at its initial 0 or 1, so every one of them matters).
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), x, y)["params"])
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
      lambda path, leaf: (float(path[-1].key == "scale") + 0.2 * rng.standard_normal(
          leaf.shape)).astype(np.float32), shapes)
  model, params = unscanned(model, params)
  logits = jax.jit(model.apply)({"params": params}, x, y).astype(jnp.float32)
  # (PAD excluded, as our search excludes it)
  ours = jax.nn.log_softmax(logits.at[..., PAD_ID].set(-1e9))
  ours = np.asarray(jnp.take_along_axis(ours, y[..., None], axis=-1)[..., 0])

  ctranslate2_model.save(ctranslate2_model.build_spec(cfg.model, params, tokenizer), tmp_path)
  translator = ctranslate2.Translator(str(tmp_path), device="cpu")
  results = translator.score_batch([tokenizer.sp.encode(s, out_type=str) for s, _ in PAIRS],
                                   [tokenizer.sp.encode(t, out_type=str) for _, t in PAIRS])
  for row, result in enumerate(results):
    real = int((y[row] > 0).sum())
    assert len(result.log_probs) == real
    np.testing.assert_allclose(result.log_probs, ours[row, :real], atol=2e-5, rtol=0)


def test_the_vocabulary_is_padded_to_the_models_rows(tiny_tokenizer):
  tokenizer = Tokenizer.load(tiny_tokenizer)
  pieces = ctranslate2_model.vocabulary(tokenizer, tokenizer.vocab_size + 3)
  assert pieces[:3] == ["<pad>", "</s>", "<unk>"]
  assert pieces[-3:] == [f"<unused_{tokenizer.vocab_size + i}>" for i in range(3)]
  assert len(set(pieces)) == len(pieces)
