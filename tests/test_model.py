"""The Transformer's parts against naive references, and its masking and caching."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import model as M

CFG = M.ModelConfig(vocab_size=40, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2,
                    num_decoder_layers=2, dropout_rate=0.0, max_len=32)
INPUTS = jnp.array([[5, 6, 7, 8, 1, 0, 0], [9, 10, 1, 0, 0, 0, 0]])
TARGETS = jnp.array([[11, 12, 13, 1, 0], [14, 15, 16, 17, 1]])


def _init(cfg=CFG):
  model = M.Transformer(cfg)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), INPUTS, TARGETS)["params"])
  return model, params


def test_sinusoidal_positions_match_the_paper_formula():
  table = M.sinusoidal_positions(10, 8)
  for pos in range(10):
    for i in range(4):
      angle = pos / 10000 ** (2 * i / 8)
      assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_scaled_dot_product_attention_matches_naive_loops():
  rng = np.random.default_rng(0)
  B, T, S, H, K = 2, 3, 4, 2, 5
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in [(B, T, H, K), (B, S, H, K),
                                                               (B, S, H, K)])
  mask = rng.random((B, 1, T, S)) > 0.3
  mask[..., 0] = True  # every query sees at least one key
  out, weights = M.scaled_dot_product_attention(q, k, v, jnp.asarray(mask), jnp.float32)
  for b in range(B):
    for h in range(H):
      for t in range(T):
        scores = np.array([q[b, t, h] @ k[b, s, h] / math.sqrt(K) for s in range(S)])
        scores = np.where(mask[b, 0, t], scores, -np.inf)
        p = np.exp(scores - scores.max())
        p /= p.sum()
        np.testing.assert_allclose(np.asarray(weights[b, h, t]), p, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out[b, t, h]), p @ v[b, :, h], atol=1e-5)
  # Masked cells get exactly zero weight.
  assert np.all(np.asarray(weights)[~np.broadcast_to(mask, weights.shape)] == 0.0)


def test_multi_head_attention_splits_projects_and_merges_heads():
  """The module equals: project to Q, K, V; split into heads; attend per head; concatenate;
  output projection — written out with plain matrices."""
  mha = M.MultiHeadAttention(CFG)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, CFG.d_model))
  mask = jnp.ones((2, 1, 5, 5), bool)
  params = nn.meta.unbox(mha.init(jax.random.PRNGKey(2), x, x, mask, True)["params"])
  out = mha.apply({"params": params}, x, x, mask, True)
  D, H, K = CFG.d_model, CFG.num_heads, CFG.head_dim
  proj = {n: (np.asarray(params[n]["kernel"]).reshape(D, D), np.asarray(params[n]["bias"])
              .reshape(D)) for n in ("query", "key", "value")}
  xn = np.asarray(x)
  q, k, v = (xn @ proj[n][0] + proj[n][1] for n in ("query", "key", "value"))
  heads = []
  for h in range(H):
    sl = slice(h * K, (h + 1) * K)
    s = q[..., sl] @ np.swapaxes(k[..., sl], -1, -2) / math.sqrt(K)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    heads.append(p @ v[..., sl])
  merged = np.concatenate(heads, -1)
  wo = np.asarray(params["output"]["kernel"]).reshape(D, D)
  expected = merged @ wo + np.asarray(params["output"]["bias"])
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4)


def test_padding_source_tokens_do_not_change_the_output():
  model, params = _init()
  logits = model.apply({"params": params}, INPUTS, TARGETS)
  # Row 1 has padding from position 3: put other tokens there and mark them as still padding
  # by keeping the mask source — change only what is hidden behind padding in the embeddings.
  changed = INPUTS.at[1, 3:].set(0)
  np.testing.assert_allclose(model.apply({"params": params}, changed, TARGETS), logits,
                             atol=1e-6)
  # Changing a real source token does change the output (the test can fail).
  other = INPUTS.at[1, 0].set(20)
  assert not np.allclose(model.apply({"params": params}, other, TARGETS)[1], logits[1],
                         atol=1e-4)


def test_encoder_ignores_values_at_padded_positions():
  """Encoder outputs at real positions do not depend on the padded positions' embeddings."""
  model, params = _init()
  enc = lambda p: model.apply({"params": p}, INPUTS, method=M.Transformer.encode)
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
  logits = model.apply({"params": params}, INPUTS, TARGETS)
  changed = TARGETS.at[:, 3:].set(30)
  new = model.apply({"params": params}, INPUTS, changed)
  # Position t predicts targets[t] from targets[<t]: positions <= 3 see only targets[:3].
  np.testing.assert_allclose(new[:, :4], logits[:, :4], atol=1e-6)
  assert not np.allclose(new[:, 4], logits[:, 4], atol=1e-4)


def test_packed_examples_do_not_attend_to_each_other():
  """Two examples packed in one row give the same logits as each alone."""
  model, params = _init()
  a_in, a_tg = jnp.array([[5, 6, 1]]), jnp.array([[11, 12, 1]])
  b_in, b_tg = jnp.array([[9, 10, 7, 1]]), jnp.array([[14, 1]])
  alone_a = model.apply({"params": params}, a_in, a_tg)
  alone_b = model.apply({"params": params}, b_in, b_tg)
  packed_in = jnp.concatenate([a_in, b_in, jnp.zeros((1, 1), jnp.int32)], 1)
  packed_tg = jnp.concatenate([a_tg, b_tg, jnp.zeros((1, 1), jnp.int32)], 1)
  in_seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
  in_pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
  tg_seg = jnp.array([[1, 1, 1, 2, 2, 0]])
  tg_pos = jnp.array([[0, 1, 2, 0, 1, 0]])
  packed = model.apply({"params": params}, packed_in, packed_tg, in_pos, tg_pos, in_seg, tg_seg)
  np.testing.assert_allclose(packed[0, :3], alone_a[0], atol=1e-5)
  np.testing.assert_allclose(packed[0, 3:5], alone_b[0], atol=1e-5)


@pytest.mark.parametrize("pre_ln,positions", [(True, "sinusoidal"), (False, "learned")])
def test_cached_step_by_step_decoding_equals_full_forward(pre_ln, positions):
  import dataclasses
  cfg = dataclasses.replace(CFG, pre_layer_norm=pre_ln, positional_encoding=positions)
  model, params = _init(cfg)
  full = model.apply({"params": params}, INPUTS, TARGETS)
  encoded = model.apply({"params": params}, INPUTS, method=M.Transformer.encode)
  _, mutated = model.apply({"params": params}, encoded, INPUTS, TARGETS.shape[1],
                           method=M.Transformer.init_cache, mutable=["cache"])
  cache = mutated["cache"]
  decoder_inputs = M.shift_right(TARGETS)
  for t in range(TARGETS.shape[1]):
    step_logits, mutated = model.apply(
        {"params": params, "cache": cache}, encoded, INPUTS, decoder_inputs[:, t:t + 1],
        decode=True, method=M.Transformer.decode, mutable=["cache"])
    cache = mutated["cache"]
    real = np.asarray(TARGETS[:, t]) > 0
    np.testing.assert_allclose(np.asarray(step_logits[:, 0])[real],
                               np.asarray(full[:, t])[real], atol=1e-4)


def test_bfloat16_path_is_close_to_float32_and_differentiable():
  import dataclasses
  model32, params = _init()
  model16 = M.Transformer(dataclasses.replace(CFG, dtype="bfloat16"))
  l32 = model32.apply({"params": params}, INPUTS, TARGETS)
  l16 = model16.apply({"params": params}, INPUTS, TARGETS)
  assert l16.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(l16), np.asarray(l32), atol=0.1)
  loss = lambda m: lambda p: jnp.mean(m.apply({"params": p}, INPUTS, TARGETS) ** 2)
  g32, g16 = jax.grad(loss(model32))(params), jax.grad(loss(model16))(params)
  assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(g16))
  flat = lambda g: jnp.concatenate([x.ravel() for x in jax.tree_util.tree_leaves(g)])
  err = float(jnp.linalg.norm(flat(g16) - flat(g32)) / jnp.linalg.norm(flat(g32)))
  assert err < 0.05, err  # bf16 rounding, not a wrong gradient (that would be ~1)


@pytest.mark.parametrize("shape", [(64, 32, 512), (3, 5, 7)])
def test_dropout_drops_at_the_rate_and_rescales(shape):
  x = jnp.ones(shape)
  drop = M.Dropout(0.1)
  y = np.asarray(drop.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(0)}))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 1 / 0.9, rtol=1e-6)  # inverted dropout
  n = kept.size
  assert abs(1 - kept.mean() - 0.1) < 5 * np.sqrt(0.1 * 0.9 / n)
  other = np.asarray(drop.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(1)}))
  assert (other != y).any()  # another key, another mask
  if n > 10_000:  # masks of different keys, and neighbouring elements, are uncorrelated
    a, b = kept.ravel().astype(float), (other != 0).ravel().astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / np.sqrt(n)
  assert drop.apply({}, x, True) is x  # deterministic: the identity


def test_d_model_not_divisible_by_heads_is_a_clear_error():
  with pytest.raises(ValueError, match=r"d_model=30 is not divisible by .*num_heads=4"):
    M.ModelConfig(d_model=30, num_heads=4)


def test_parameters_carry_logical_axis_names():
  model = M.Transformer(CFG)
  boxed = model.init(jax.random.PRNGKey(0), INPUTS, TARGETS)["params"]
  specs = nn.get_partition_spec(boxed)
  assert tuple(specs["encoder_0"]["self_attention"]["query"]["kernel"]) == ("embed", "heads",
                                                                             "kv")
  assert tuple(specs["encoder_0"]["feed_forward"]["wi"]["kernel"]) == ("embed", "mlp")
  assert tuple(specs["source_embedding"]["embedding"]) == ("vocab", "embed")


@pytest.mark.parametrize("spec, a_shape, b_shape", [
    ("...a,abc->...bc", (2, 5, 8), (8, 2, 4)),     # split heads
    ("...ab,abc->...c", (2, 5, 2, 4), (2, 4, 8)),  # merge heads
    ("...a,ab->...b", (2, 5, 8), (8, 16)),         # feed-forward
    ("...a,ab->...b", (2, 5, 16), (16, 8)),        # (cotangent smaller than activations)
    ("btd,vd->btv", (2, 5, 8), (32, 8)),           # tied output embedding
])
def test_matmul_gradients_equal_jax_grad_of_einsum_in_f32(spec, a_shape, b_shape):
  """The projections' own VJP (which orders the weight-gradient matmul for XLA:CPU) computes
  the same gradients as jax.grad of a plain einsum: f32 stays the exact reference."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.normal(size=a_shape), jnp.float32)
  b = jnp.asarray(rng.normal(size=b_shape), jnp.float32)
  out_shape = jnp.einsum(spec, a, b).shape
  g = jnp.asarray(rng.normal(size=out_shape), jnp.float32)
  ours = jax.grad(lambda a, b: jnp.sum(M.matmul(spec, a, b, jnp.float32) * g),
                  argnums=(0, 1))(a, b)
  plain = jax.grad(lambda a, b: jnp.sum(jnp.einsum(spec, a, b) * g), argnums=(0, 1))(a, b)
  for x, y in zip(ours, plain):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
