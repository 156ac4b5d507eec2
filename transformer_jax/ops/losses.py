"""Label-smoothed cross-entropy, plain (`cross_entropy`, on logits) and fused with the softmax
output layer (`output_loss`, computed in chunks of tokens; what training uses).

The plain path materialises (tokens, vocab) arrays several times over — logits,
log-probabilities, their gradient — which at vocabulary 8000 is most of a training step's
memory traffic. The fused path walks over chunks of tokens and, for each, computes the logits,
the loss, *and* its gradient with respect to the hidden states and the output matrix while the
chunk is still in cache; the backward pass only scales them. The numbers are the same as the
plain path's (tested); only the order of the work changes. With bf16 logits
(`logits_dtype_for`, TPUs) they are the plain path's within the logits' bf16 rounding.
Evaluation and decoding use the model's logits and `cross_entropy`.

`device_output_loss` runs it per device over a mesh's data axes (`shard_map`): each device walks
over its own tokens' tiles and accumulates its own output-matrix gradient, and the one
all-reduce of that gradient (shard_map's transpose of the replicated table) comes after the
loop, not in every tile of a loop over the global batch.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from transformer_jax.config.population import is_static
from transformer_jax.ops.interleave import merge_interleaved, split_interleaved
from transformer_jax.ops.platform import traced_for

CHUNK_TOKENS = 256  # the default tile (config.model.loss_tile_tokens)
LOSS_SCOPE = "output_loss"  # the fused loss's operations' name scope
# The smallest tile on accelerators, up to LOGITS_BUDGET bytes of a tile's f32 logits. Each
# tile reads and writes the output matrix's f32 gradient accumulator: on a TPU v5p, wmt_base's
# 8192 tokens per chip in 256-token tiles moved several GB more memory traffic per step than
# in one tile (BENCHMARKS.md, "Compiled for TPUs without one"), while 8192 tokens' f32 logits at
# vocabulary 32000 take 1 GiB. On CPU the configured tile stays: a cache-sized one ran faster there.
ACCELERATOR_TILE_TOKENS = 8192
LOGITS_BUDGET = 2**30


def tile_for(platform: str, tile: int, vocab_size: int) -> int:
  """The tile that `config.model.loss_tile_tokens` = `tile` means on `platform`."""
  if platform == "cpu" or tile == 0:
    return tile
  return max(tile, min(ACCELERATOR_TILE_TOKENS, LOGITS_BUDGET // (4 * vocab_size)))


def smoothing_constants(V: int, label_smoothing):
  """(target probability, every other token's probability, the smoothed target's entropy);
  the label-smoothed loss has that entropy, its minimum, subtracted. Python floats computed
  in float64 for a number; f32 arrays for a traced value (a population member's)."""
  if not is_static(label_smoothing):
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (V - 1)
    entropy = -(confidence * jnp.log(confidence) + (V - 1) * low * jnp.log(low + 1e-20))
    return confidence, low, jnp.where(label_smoothing > 0, entropy, 0.0)
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (V - 1)
  entropy = -(confidence * np.log(confidence) + (V - 1) * low * np.log(low + 1e-20)) \
      if label_smoothing > 0 else 0.0
  return confidence, low, entropy




def cross_entropy(logits_BTV, targets_BT, weights_BT, label_smoothing: float):
  """Sums over real tokens of (label-smoothed loss, plain NLL), and the token count.

  The smoothed loss has its minimum (the entropy of the smoothed target) subtracted, so that
  a perfect model scores 0 whatever the smoothing.
  """
  V = logits_BTV.shape[-1]
  log_probs = jax.nn.log_softmax(logits_BTV.astype(jnp.float32))
  nll_BT = -jnp.take_along_axis(log_probs, targets_BT[..., None], axis=-1)[..., 0]
  confidence, low, entropy = smoothing_constants(V, label_smoothing)
  smooth_BT = confidence * nll_BT - low * (jnp.sum(log_probs, axis=-1) + nll_BT)
  loss_BT = smooth_BT - entropy
  w = weights_BT.astype(jnp.float32)
  return jnp.sum(loss_BT * w), jnp.sum(nll_BT * w), jnp.sum(w)
def logits_dtype_for(setting: str, dtype, platform: str) -> jnp.dtype:
  """The dtype the fused loss writes its (tokens, vocab) logits in: `setting`
  (config.model.logits_dtype), "auto" resolved for `platform`: bf16 on TPUs with bf16
  matmuls (the logits are most of the loss's memory traffic, and the TPU compiler predicts
  the step faster with them: BENCHMARKS.md, "The TPU memory wall"), f32 elsewhere.
  Statistics, the loss and its gradient are computed in f32 either way; bf16 logits need
  bf16 matmuls."""
  if setting == "auto":
    setting = "bfloat16" if platform == "tpu" else "float32"
  return jnp.bfloat16 if setting == "bfloat16" and dtype == jnp.bfloat16 else jnp.float32


def _target_logits(logits_CV, h_CD, table_VD, targets_C, dtype):
  """Each token's logit of its target, in f32. From f32 logits, picked out of them; from
  16-bit ones, each computed from its own row of the table and rounded as the logits were:
  the same number up to summation order, without one more pass over the (tokens, vocab)
  array."""
  if logits_CV.dtype == jnp.float32:
    return jnp.take_along_axis(logits_CV, targets_C[:, None], axis=-1)[:, 0]
  def rounded(x, to):  # x rounded to the precision of `to`, kept in f32
    info = jnp.finfo(to)
    return jax.lax.reduce_precision(x.astype(jnp.float32), info.nexp, info.nmant)

  # (inputs rounded as the matmul's, products exact, the sum in f32; not as a dot of `dtype`
  # inputs, nor by converts there and back: XLA:CPU (jaxlib 0.10) rounds each product of
  # that dot to bf16, and drops a pair of converts when it fuses them)
  exact_C = jnp.sum(rounded(h_CD, dtype) * rounded(jnp.take(table_VD, targets_C, axis=0),
                                                   dtype), axis=-1)
  return rounded(exact_C, logits_CV.dtype)


def _chunk_forward_backward(h_CD, table_VD, targets_C, weights_C, smoothing, dtype,
                            logits_dtype):
  """Per-token (smoothed loss, NLL) of a chunk, and d(sum of weighted smoothed loss)/d logits
  pushed through the output layer: (dh_CD, dtable_VD). `smoothing`: smoothing_constants';
  `logits_dtype`: what the logits are written in (`logits_dtype_for`)."""
  V = table_VD.shape[0]
  confidence, low, entropy = smoothing
  stored_CV = jnp.einsum("cd,vd->cv", h_CD.astype(dtype), table_VD.astype(dtype),
                         preferred_element_type=logits_dtype)
  logits_CV = stored_CV.astype(jnp.float32)  # (converted where read: fused into each pass)
  m_C = jnp.max(logits_CV, axis=-1)
  exp_CV = jnp.exp(logits_CV - m_C[:, None])
  sum_exp_C = jnp.sum(exp_CV, axis=-1)
  lse_C = jnp.log(sum_exp_C) + m_C
  target_logit_C = _target_logits(stored_CV, h_CD, table_VD, targets_C, dtype)
  nll_C = lse_C - target_logit_C
  sum_log_probs_C = jnp.sum(logits_CV, axis=-1) - V * lse_C
  loss_C = confidence * nll_C - low * (sum_log_probs_C + nll_C) - entropy
  # d loss / d logits = (confidence + low (V - 1)) p - (confidence - low) onehot - low
  #                   = p - (confidence - low) onehot - low   (confidence + low (V-1) = 1)
  probs_CV = exp_CV / sum_exp_C[:, None]
  onehot_CV = jax.nn.one_hot(targets_C, V, dtype=jnp.float32)
  dlogits_CV = (probs_CV - (confidence - low) * onehot_CV - low) * weights_C[:, None]
  d_c = dlogits_CV.astype(dtype)
  dh_CD = jnp.einsum("cv,vd->cd", d_c, table_VD.astype(dtype),
                     preferred_element_type=jnp.float32)
  dtable_VD = _contract_tokens(d_c, h_CD.astype(dtype))
  return loss_C, nll_C, dh_CD, dtable_VD


def _contract_tokens(d_CV, h_CD):
  """d_CV^T h_CD (V, D) in f32. XLA:CPU runs this 2-D product, which contracts the leading
  axis of both operands, as an f32 matmul even for bf16 inputs; split into two token axes
  it stays a bf16 matmul, faster (BENCHMARKS.md, "Against the PyTorch peer")."""
  C = d_CV.shape[0]
  if C % 2:
    return jnp.einsum("cv,cd->vd", d_CV, h_CD, preferred_element_type=jnp.float32)
  return jnp.einsum("scv,scd->vd", d_CV.reshape(2, C // 2, -1), h_CD.reshape(2, C // 2, -1),
                    preferred_element_type=jnp.float32)


def _num_chunks(n: int, tile: int) -> int:
  """Tiles of a loop over n tokens: one when tile is 0 or n <= tile; else tiles of gcd(n, tile)
  tokens, or one tile of all n when that is under 64."""
  if not tile or n <= tile:
    return 1
  chunk = math.gcd(n, tile)
  return n // chunk if chunk >= 64 else 1


def _forward_backward(h_ND, table_VD, targets_N, weights_N, smoothing, dtype, tile,
                      logits_dtype):
  k = _num_chunks(h_ND.shape[0], tile)

  def body(dtable, xs):
    h, t, w = xs
    loss, nll, dh, dtab = _chunk_forward_backward(h, table_VD, t, w, smoothing, dtype,
                                                  logits_dtype)
    return dtable + dtab, (jnp.sum(loss * w), jnp.sum(nll * w), dh)

  dtable, (loss_sums, nll_sums, dh) = jax.lax.scan(
      body, jnp.zeros(table_VD.shape, jnp.float32),
      (split_interleaved(h_ND, k), split_interleaved(targets_N, k),
       split_interleaved(weights_N, k)))
  return ((jnp.sum(loss_sums), jnp.sum(nll_sums), jnp.sum(weights_N)),
          (merge_interleaved(dh), dtable))


def output_loss(h_ND, table_VD, targets_N, weights_N, label_smoothing, dtype,
                tile: int = CHUNK_TOKENS, logits_dtype=jnp.float32):
  """(sum of weighted label-smoothed losses, sum of weighted NLLs, sum of weights) of the
  softmax layer `softmax(h @ table.T)` against `targets`, in tiles of `tile` tokens. Only the
  first output is differentiable (through `h` and `table`); NLL and the count are reported as
  they are. `label_smoothing` may be traced (a population member's)."""
  return _output_loss(h_ND, table_VD, targets_N, weights_N,
                      smoothing_constants(table_VD.shape[0], label_smoothing), dtype, tile,
                      logits_dtype)


# (the smoothing constants an argument, not a static one: a population's are traced)
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _output_loss(h_ND, table_VD, targets_N, weights_N, smoothing, dtype, tile, logits_dtype):
  sums, _ = _forward_backward(h_ND, table_VD, targets_N, weights_N, smoothing, dtype, tile,
                              logits_dtype)
  return sums


def _output_loss_fwd(h_ND, table_VD, targets_N, weights_N, smoothing, dtype, tile,
                     logits_dtype):
  # (named: the compile tool's traffic by block finds the loss's operations by it)
  with jax.named_scope(LOSS_SCOPE):
    sums, grads = _forward_backward(h_ND, table_VD, targets_N, weights_N, smoothing, dtype,
                                    tile, logits_dtype)
  # (zero-size arrays carry the input dtypes: residuals must be arrays)
  return sums, (grads, targets_N, weights_N, smoothing, jnp.zeros((0,), h_ND.dtype),
                jnp.zeros((0,), table_VD.dtype))


def _output_loss_bwd(dtype, tile, logits_dtype, residuals, cotangents):
  (dh_ND, dtable_VD), targets_N, weights_N, smoothing, h_like, table_like = residuals
  g = cotangents[0]  # the loss sum's; the NLL sum and the count are not differentiated
  zeros_like_int = np.zeros(targets_N.shape, jax.dtypes.float0)
  with jax.named_scope(LOSS_SCOPE):
    return ((g * dh_ND).astype(h_like.dtype), (g * dtable_VD).astype(table_like.dtype),
            zeros_like_int, jnp.zeros_like(weights_N),
            jax.tree_util.tree_map(jnp.zeros_like, smoothing))


_output_loss.defvjp(_output_loss_fwd, _output_loss_bwd)


def device_output_loss(h_ND, table_VD, targets_N, weights_N, label_smoothing: float, dtype,
                       tile: int, mesh: Mesh | None, batch_axes: tuple[str, ...],
                       logits: str = "float32"):
  """`output_loss` computed on each device for its own tokens (the leading axis split over
  `batch_axes` of `mesh`, the table replicated), the sums added over devices after. Without a
  mesh, with one device per batch, or with other mesh axes in use, it is `output_loss`.
  `tile` and `logits` (config.model.loss_tile_tokens and logits_dtype) are resolved for the
  platform the program is traced for."""
  tile = tile_for(traced_for(), tile, table_VD.shape[0])
  logits_dtype = logits_dtype_for(logits, dtype, traced_for())
  axes = tuple(a for a in batch_axes if mesh is not None and mesh.shape[a] > 1)
  if not axes or any(mesh.shape[a] > 1 for a in mesh.axis_names if a not in batch_axes):
    return output_loss(h_ND, table_VD, targets_N, weights_N, label_smoothing, dtype, tile,
                       logits_dtype)

  smoothing = jnp.stack([jnp.asarray(c, jnp.float32) for c in smoothing_constants(
      table_VD.shape[0], label_smoothing)])  # (an argument: a population's are traced)

  def local(h, table, targets, weights, smoothing):
    sums = _output_loss(h, table, targets, weights, tuple(smoothing), dtype, tile,
                        logits_dtype)
    return tuple(jax.lax.psum(x, axes) for x in sums)

  # (check_vma=False: the scan's carry is the device's own table gradient; shard_map's
  # transpose still adds the replicated table's cotangents over the devices, tested)
  tokens = P(batch_axes)
  return jax.shard_map(local, mesh=mesh, in_specs=(tokens, P(), tokens, tokens, P()),
                       out_specs=(P(), P(), P()), check_vma=False)(
                           h_ND, table_VD, targets_N, weights_N, smoothing)
