"""`config.model`: the Transformer's sizes and options, each declared once with what it does to
a trained model's weights, its choices, and its value for runs from before it.

What an option does to trained weights (`weights` of each field) decides how the rest of the
package treats it:
  SHAPES    the weights' shapes or layout change with it: a checkpoint of another value does
            not fit (a shape comparison finds it)
  FUNCTION  what the weights compute depends on it (their parameters may differ too): a run
            started from another run's weights (config.init_from) must keep that run's value,
            and an error names it otherwise
  FREE      how the model trains or runs, not what its weights compute: free to change
Every option has a row in `interop.model_options` (its CTranslate2 form, its Marian key).
"""

from __future__ import annotations

import dataclasses

from transformer_jax.config.checks import check_positive, check_rate
from transformer_jax.config.fields import check_choices, declared
from transformer_jax.errors import ConfigError

SHAPES, FUNCTION, FREE = "shapes", "function", "free"
DTYPES = ("float32", "bfloat16")  # what a run computes in ("auto" resolves to one of them)
GATED_ACTIVATIONS = ("swiglu", "geglu")  # act(x W_gate) * (x W_up): three matrices, not two


def option(weights: str, **field):
  """A ModelConfig field: what it does to trained weights (SHAPES, FUNCTION or FREE) and
  `field` (config.fields.declared: its value for older runs, its choices)."""
  return declared(weights=weights, **field)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and options of the Transformer (`config.model`)."""
  # joint source/target subword vocabulary
  vocab_size: int = option(SHAPES)
  # width of embeddings and the residual stream
  d_model: int = option(SHAPES)
  # attention heads; d_model % num_heads == 0
  num_heads: int = option(SHAPES)
  # hidden width of the position-wise feed-forward
  d_ff: int = option(SHAPES)
  # layers of the encoder stack
  num_encoder_layers: int = option(SHAPES)
  # layers of the decoder stack
  num_decoder_layers: int = option(SHAPES)
  # on embeddings and each residual branch
  dropout_rate: float = option(FREE)
  # on attention weights
  attention_dropout_rate: float = option(FREE)
  # after the feed-forward activation
  ffn_dropout_rate: float = option(FREE)
  # pre-LN (stable) or the paper's post-LN
  pre_layer_norm: bool = option(FUNCTION)
  # "layernorm" (the paper's) or "rmsnorm" (no centring, no bias)
  norm: str = option(SHAPES, choices=("layernorm", "rmsnorm"), before="layernorm")
  # added to the variance in LayerNorm/RMSNorm (Flax's 1e-6; PyTorch's and Marian's 1e-5)
  norm_epsilon: float = option(FUNCTION, before=1e-6)
  # "relu" (the paper's), "gelu", "silu" (swish: Marian's), or gated "swiglu" / "geglu":
  # act(x W_gate) * (x W_up), each D->d_ff (so 3 D d_ff weights, not 2: d_ff = 2/3 of a relu
  # layer's keeps the parameter count)
  ffn_activation: str = option(FUNCTION, choices=("relu", "gelu", "silu", *GATED_ACTIVATIONS),
                               before="relu")
  # key/value heads (grouped-query attention; 1 = multi-query); 0 or num_heads = the paper's
  # multi-head attention
  num_kv_heads: int = option(SHAPES, before=0)
  # "sinusoidal" (the paper's: sin, cos interleaved), "sinusoidal_concat" (all sines, then all
  # cosines: the table of tensor2tensor, fairseq and Marian) or "learned", added to the
  # embeddings; or, in self-attention only, "rotary" (RoFormer: queries and keys rotated by
  # position) or "relative" (T5: a learned bias per head and bucket of key-query offsets)
  positional_encoding: str = option(FUNCTION, choices=(
      "sinusoidal", "sinusoidal_concat", "learned", "rotary", "relative"))
  # "relative": offset buckets (half per direction in the encoder)
  relative_num_buckets: int = option(SHAPES, before=32)
  # "relative": offsets beyond this share the last bucket
  relative_max_distance: int = option(FUNCTION, before=128)
  # longest source/target position supported
  max_len: int = option(SHAPES)
  # one embedding table for source and target
  share_embeddings: bool = option(FUNCTION)
  # token embeddings times sqrt(d_model) (the paper's)
  scale_embeddings: bool = option(FUNCTION, before=True)
  # the output softmax uses the target embedding matrix
  tie_output_embedding: bool = option(FUNCTION)
  # a learned bias per vocabulary entry added to the output logits (Marian's
  # final_logits_bias)
  output_bias: bool = option(SHAPES, before=False)
  # matmul inputs: "float32" (exact), "bfloat16" (f32 accumulation) or "auto" (what the
  # hardware runs fastest; parallel.numerics)
  dtype: str = option(FREE, choices=("auto", *DTYPES))
  # "einsum" (our products, tuned for XLA:CPU), "xla" or "cudnn" (jax.nn.dot_product_attention),
  # "softmax_once" (probabilities written once, read by the backward pass: ops.attention);
  # "auto": cudnn on GPUs (bf16, head_dim % 8 == 0 and <= 128), softmax_once on TPUs, else
  # einsum. Attention maps, attention dropout and decoding use einsum
  attention_impl: str = option(FREE, choices=("auto", "einsum", "xla", "cudnn", "softmax_once"),
                               before="einsum")
  # "float32" or "bfloat16": projection and LayerNorm outputs between matmuls (with bf16
  # matmuls only; residual stream, LayerNorm statistics, softmax and loss stay f32); "auto":
  # bfloat16 in programs traced for GPUs, float32 elsewhere (model.embeddings.activation_dtype)
  activation_dtype: str = option(FREE, choices=("auto", *DTYPES), before="float32")
  # what the fused output layer + loss writes its (tokens, vocab) logits in (with bf16 matmuls;
  # statistics, loss and gradient in f32 either way); "auto": bfloat16 in programs traced for
  # TPUs, float32 elsewhere (ops.losses.logits_dtype_for)
  logits_dtype: str = option(FREE, choices=("auto", *DTYPES), before="float32")
  # tokens per tile of the fused output layer + loss, per device (0: one tile); on
  # accelerators >= 8192 (ops.losses.tile_for)
  loss_tile_tokens: int = option(FREE, before=256)
  # recompute activations in the backward pass: "none", "full" (keep only layer inputs) or
  # "dots" (keep matmul outputs)
  remat: str = option(FREE, choices=("none", "full", "dots"))
  # RMS-normalise each head's queries and keys in self-attention (a learned scale per
  # dimension) before their dot product: logits that cannot grow without bound (OLMo 2, Qwen3)
  qk_norm: bool = option(SHAPES, before=False)
  # one nn.scan-ned layer per stack (fast compiles for deep models; parameters stacked on a
  # leading layer axis)
  scan_layers: bool = option(SHAPES)

  def __post_init__(self):
    if self.d_model % self.num_heads:
      raise ConfigError(f"config.model.d_model={self.d_model} is not divisible by "
                        f"config.model.num_heads={self.num_heads}")
    check_choices("config.model", self)
    if self.positional_encoding == "rotary" and self.head_dim % 2:
      raise ConfigError(f"config.model.positional_encoding='rotary' needs an even head "
                        f"dimension; d_model / num_heads = {self.head_dim}")
    check_positive("model", self, ("relative_num_buckets", "relative_max_distance"))
    if not 0 < self.norm_epsilon < 1:
      raise ConfigError(f"config.model.norm_epsilon={self.norm_epsilon} must be in (0, 1)")
    if self.num_kv_heads < 0 or (self.num_kv_heads and self.num_heads % self.num_kv_heads):
      raise ConfigError(f"config.model.num_kv_heads={self.num_kv_heads} must divide "
                        f"config.model.num_heads={self.num_heads} (0 = num_heads)")
    if self.loss_tile_tokens < 0:
      raise ConfigError(f"config.model.loss_tile_tokens={self.loss_tile_tokens} must be >= 0")
    check_positive("model", self, ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"))
    check_rate("model", self, ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate"))

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    """Key/value heads: num_kv_heads, or num_heads when it is 0."""
    return self.num_kv_heads or self.num_heads


def options(weights: str) -> tuple[str, ...]:
  """The names of the ModelConfig fields whose `weights` is SHAPES, FUNCTION or FREE."""
  return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata["weights"] == weights)
