"""The whole model: padding, causality and packing masks, cached decoding against the full
forward pass, the bf16 path, and the parameters' logical axis names."""

import dataclasses
import functools
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from tests.model_variants import VARIANTS, model_fields
from transformer_jax.model.transformer import (
  FeedForward,
  Transformer,
  make_norm,
  shift_right,
  unscanned,
)

CFG = helpers.section("model", vocab_size=40, d_model=32, num_heads=4, d_ff=64,
                      num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0, max_len=32)
INPUTS = jnp.array([[5, 6, 7, 8, 1, 0, 0], [9, 10, 1, 0, 0, 0, 0]])
TARGETS = jnp.array([[11, 12, 13, 1, 0], [14, 15, 16, 17, 1]])


@functools.lru_cache(maxsize=None)
def _init(cfg=CFG):
  """The model and its initial parameters (initialised once per config, compiled)."""
  model = Transformer(cfg)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), INPUTS, TARGETS)["params"])
  return model, params


@functools.partial(jax.jit, static_argnums=0)
def _logits(model, params, *args):
  """Teacher-forced logits (compiled: one program per shape, not op by op)."""
  return model.apply({"params": params}, *args)


def test_padding_source_tokens_do_not_change_the_output():
  model, params = _init()
  logits = _logits(model, params, INPUTS, TARGETS)
  # Row 1 has padding from position 3: put other tokens there and mark them as still padding
  # by keeping the mask source — change only what is hidden behind padding in the embeddings.
  changed = INPUTS.at[1, 3:].set(0)
  np.testing.assert_allclose(_logits(model, params, changed, TARGETS), logits,
                             atol=1e-6)
  # Changing a real source token does change the output (the test can fail).
  other = INPUTS.at[1, 0].set(20)
  assert not np.allclose(_logits(model, params, other, TARGETS)[1], logits[1],
                         atol=1e-4)


def test_encoder_ignores_values_at_padded_positions():
  """Encoder outputs at real positions do not depend on the padded positions' embeddings."""
  model, params = _init()

  def enc(p):
    return model.apply({"params": p}, INPUTS, method=Transformer.encode)

  base = enc(params)
  # Perturb the embedding row of token 0 (padding): real positions must not move.
  p2 = jax.tree_util.tree_map(lambda x: x, params)
  table = p2["source_embedding"]["embedding"]
  p2["source_embedding"]["embedding"] = table.at[0].add(5.0)
  moved = enc(p2)
  real = np.asarray(INPUTS) > 0
  np.testing.assert_allclose(np.asarray(moved)[real], np.asarray(base)[real], atol=1e-5)


def test_future_target_tokens_do_not_change_earlier_logits():
  model, params = _init()
  logits = _logits(model, params, INPUTS, TARGETS)
  changed = TARGETS.at[:, 3:].set(30)
  new = _logits(model, params, INPUTS, changed)
  # Position t predicts targets[t] from targets[<t]: positions <= 3 see only targets[:3].
  np.testing.assert_allclose(new[:, :4], logits[:, :4], atol=1e-6)
  assert not np.allclose(new[:, 4], logits[:, 4], atol=1e-4)


def test_packed_examples_do_not_attend_to_each_other():
  """Two examples packed in one row give the same logits as each alone."""
  model, params = _init()
  a_in, a_tg = jnp.array([[5, 6, 1]]), jnp.array([[11, 12, 1]])
  b_in, b_tg = jnp.array([[9, 10, 7, 1]]), jnp.array([[14, 1]])
  alone_a = _logits(model, params, a_in, a_tg)
  alone_b = _logits(model, params, b_in, b_tg)
  packed_in = jnp.concatenate([a_in, b_in, jnp.zeros((1, 1), jnp.int32)], 1)
  packed_tg = jnp.concatenate([a_tg, b_tg, jnp.zeros((1, 1), jnp.int32)], 1)
  in_seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
  in_pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
  tg_seg = jnp.array([[1, 1, 1, 2, 2, 0]])
  tg_pos = jnp.array([[0, 1, 2, 0, 1, 0]])
  packed = _logits(model, params, packed_in, packed_tg, in_pos, tg_pos, in_seg, tg_seg)
  np.testing.assert_allclose(packed[0, :3], alone_a[0], atol=1e-5)
  np.testing.assert_allclose(packed[0, 3:5], alone_b[0], atol=1e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_step_by_step_decoding_equals_full_forward(variant):
  cfg = dataclasses.replace(CFG, **model_fields(variant))
  model, params = _init(cfg)
  full = _logits(model, params, INPUTS, TARGETS)
  model, params = unscanned(model, params)  # (decoding reads layers one by one)
  encoded = model.apply({"params": params}, INPUTS, method=Transformer.encode)
  _, mutated = model.apply({"params": params}, encoded, INPUTS, TARGETS.shape[1],
                           method=Transformer.init_cache, mutable=["cache"])
  cache = mutated["cache"]
  decoder_inputs = shift_right(TARGETS)

  @jax.jit
  def decode_step(cache, tokens_B1, positions_B1):  # one cached step, compiled once
    return model.apply({"params": params, "cache": cache}, encoded, INPUTS, tokens_B1,
                       targets_positions_BT=positions_B1, cached=True,
                       method=Transformer.decoder_logits, mutable=["cache"])

  # Rows at steps of their own: row b starts lags[b] steps late (until then it decodes its
  # first position again), as sentences put into decoding slots at different times do.
  B, T = TARGETS.shape
  lags = np.arange(B) % 3
  for t in range(T + lags.max()):
    positions = np.clip(t - lags, 0, T - 1)
    tokens = np.asarray(decoder_inputs)[np.arange(B), positions]
    step_logits, mutated = decode_step(cache, jnp.asarray(tokens[:, None]),
                                       jnp.asarray(positions[:, None], jnp.int32))
    cache = mutated["cache"]
    now = (t - lags >= 0) & (t - lags < T)
    real = now & (np.asarray(TARGETS)[np.arange(B), positions] > 0)
    np.testing.assert_allclose(np.asarray(step_logits[:, 0])[real],
                               np.asarray(full)[np.arange(B), positions][real], atol=1e-4)


def test_bfloat16_path_is_close_to_float32_and_differentiable():
  model32, params = _init()
  model16 = Transformer(dataclasses.replace(CFG, dtype="bfloat16"))
  l32 = _logits(model32, params, INPUTS, TARGETS)
  l16 = _logits(model16, params, INPUTS, TARGETS)
  assert l16.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(l16), np.asarray(l32), atol=0.1)

  def grads(model):
    return jax.jit(jax.grad(lambda p: jnp.mean(model.apply({"params": p}, INPUTS, TARGETS) ** 2)))

  g32, g16 = grads(model32)(params), grads(model16)(params)
  assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(g16))

  def flat(g):
    return jnp.concatenate([x.ravel() for x in jax.tree_util.tree_leaves(g)])

  err = float(jnp.linalg.norm(flat(g16) - flat(g32)) / jnp.linalg.norm(flat(g32)))
  assert err < 0.05, err  # bf16 rounding, not a wrong gradient (that would be ~1)


@pytest.mark.parametrize("pre_layer_norm", [True, False])
def test_bfloat16_activations_stay_close_and_keep_the_residual_stream_f32(pre_layer_norm):
  """activation_dtype="bfloat16" (bf16 matmuls): sublayer outputs and the LayerNorms that feed
  matmuls are bf16; the residual stream (each layer's output) and the logits stay f32; values
  and gradients stay within bf16 rounding of the f32-activation model."""
  cfg16 = dataclasses.replace(CFG, dtype="bfloat16", pre_layer_norm=pre_layer_norm)
  base, params = _init(cfg16)
  act = Transformer(dataclasses.replace(cfg16, activation_dtype="bfloat16"))
  (logits, seen) = act.apply({"params": params}, INPUTS, TARGETS,
                             capture_intermediates=True, mutable=["intermediates"])
  found = jax.tree_util.tree_leaves_with_path(seen["intermediates"])
  dtypes = {jax.tree_util.keystr(path): x.dtype for path, x in found}
  wo = [d for k, d in dtypes.items() if "'wo'" in k]
  layer = r"\['(en|de)coder_\d+'\]\['__call__'\]\[0\]"  # (a layer's output)
  layer_out = [d for k, d in dtypes.items() if re.fullmatch(layer, k)]
  assert wo and set(wo) == {np.dtype(jnp.bfloat16)}
  assert layer_out and set(layer_out) == {np.dtype(np.float32)} and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logits), np.asarray(_logits(base, params, INPUTS,
                                                                     TARGETS)), atol=0.1)

  def grads(model):
    return jax.jit(jax.grad(lambda p: jnp.mean(model.apply({"params": p}, INPUTS, TARGETS) ** 2)))

  g_base, g_act = (jnp.concatenate([x.ravel() for x in jax.tree_util.tree_leaves(
      grads(m)(params))]) for m in (base, act))
  assert float(jnp.linalg.norm(g_act - g_base) / jnp.linalg.norm(g_base)) < 0.05


def test_parameters_carry_logical_axis_names():
  model = Transformer(CFG)
  boxed = model.init(jax.random.PRNGKey(0), INPUTS, TARGETS)["params"]
  specs = nn.get_partition_spec(boxed)
  assert tuple(specs["encoder_0"]["self_attention"]["query"]["kernel"]) == ("embed", "heads",
                                                                             "kv")
  assert tuple(specs["encoder_0"]["feed_forward"]["wi"]["kernel"]) == ("embed", "mlp")
  assert tuple(specs["source_embedding"]["embedding"]) == ("vocab", "embed")


def test_rmsnorm_and_the_gated_feed_forward_layers_equal_their_formulas():
  x = jax.random.normal(jax.random.PRNGKey(3), (2, 5, CFG.d_model))
  norm = make_norm(dataclasses.replace(CFG, norm="rmsnorm"), "n")
  scale = jax.random.uniform(jax.random.PRNGKey(4), (CFG.d_model,), minval=0.5, maxval=2.0)
  xn = np.asarray(x, np.float64)
  expected = xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + 1e-6) * np.asarray(scale)
  np.testing.assert_allclose(np.asarray(norm.apply({"params": {"scale": scale}}, x)), expected,
                             rtol=1e-5, atol=1e-6)

  silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
  erf = np.vectorize(math.erf)
  gelu = lambda z: 0.5 * z * (1 + erf(z / math.sqrt(2)))  # noqa: E731 (exact, not tanh)
  for activation, act in (("swiglu", silu), ("geglu", gelu), ("gelu", gelu)):
    ffn = FeedForward(dataclasses.replace(CFG, ffn_activation=activation))
    params = nn.meta.unbox(ffn.init(jax.random.PRNGKey(5), x, True)["params"])
    for layer in params.values():  # (non-zero biases, so that they are checked too)
      layer["bias"] = jax.random.normal(jax.random.PRNGKey(6), layer["bias"].shape)
    p = {k: {n: np.asarray(v, np.float64) for n, v in layer.items()}
         for k, layer in params.items()}
    linear = lambda h, name: h @ p[name]["kernel"] + p[name]["bias"]  # noqa: E731
    if activation == "gelu":
      assert sorted(p) == ["wi", "wo"]
      hidden = act(linear(xn, "wi"))
    else:
      assert sorted(p) == ["wi_gate", "wi_up", "wo"]
      hidden = act(linear(xn, "wi_gate")) * linear(xn, "wi_up")
    np.testing.assert_allclose(np.asarray(ffn.apply({"params": params}, x, True)),
                               linear(hidden, "wo"), rtol=1e-4, atol=1e-5)


def test_fewer_key_value_heads_shrink_the_decoding_cache_by_that_factor():
  sizes = {}
  for kv_heads in (0, 2, 1):
    model, params = _init(dataclasses.replace(CFG, num_kv_heads=kv_heads))
    encoded = model.apply({"params": params}, INPUTS, method=Transformer.encode)
    _, mutated = model.apply({"params": params}, encoded, INPUTS, 10,
                             method=Transformer.init_cache, mutable=["cache"])
    sizes[kv_heads] = sum(x.size for path, x in
                          jax.tree_util.tree_flatten_with_path(mutated["cache"])[0]
                          if "cached_" in jax.tree_util.keystr(path))
  assert sizes[0] == 2 * sizes[2] == 4 * sizes[1] > 0
