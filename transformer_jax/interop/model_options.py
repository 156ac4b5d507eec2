"""One row per model option (`config.model`): where an exported CTranslate2 model holds it
(`ctranslate2_model.build_spec` writes it there), and what a Hugging Face Marian model's config
says of it (`hf_marian.model_options` reads it from here). A test keeps a row for every field
of `ModelConfig`, and its CTranslate2 test scores every option's values against CTranslate2.
`python -m transformer_jax.interop.model_options` prints the table as
docs/reference/model-options.md."""

from __future__ import annotations

import dataclasses

from transformer_jax.config.model import FREE, ModelConfig

# Marian's activation_function values, as our ffn_activation
MARIAN_ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}


@dataclasses.dataclass(frozen=True)
class Marian:
  """What a Marian model's config.json says of an option: the `key` holding it (its values
  renamed by `names`), or the `value` every Marian model has; neither: `about` says."""
  key: str = ""
  value: object = None
  names: dict | None = None
  about: str = ""

  @property
  def given(self) -> bool:
    return bool(self.key) or self.value is not None

  def read(self, hf: dict):
    """The option's value for Marian config `hf` (given: a key or a value)."""
    if not self.key:
      return self.value
    return self.names[hf[self.key]] if self.names else hf[self.key]

  def __str__(self):
    if self.key:
      return f"`{self.key}`" + (" (" + ", ".join(
          f"{k!r} -> {v!r}" for k, v in self.names.items()) + ")" if self.names else "")
    return f"always `{self.value!r}`" if self.value is not None else self.about


@dataclasses.dataclass(frozen=True)
class Row:
  ctranslate2: str  # where CTranslate2's TransformerSpec holds it ("" for FREE options)
  marian: Marian


NOT_MARIAN = Marian(about="not a Marian option: the default config's value")
ROWS = {
    "vocab_size": Row("the embedding tables' and decoder.projection's rows (pieces padded "
                      "to them)", Marian("vocab_size")),
    "d_model": Row("the weights' widths", Marian("d_model")),
    "num_heads": Row("num_heads of both stacks", Marian("encoder_attention_heads")),
    "d_ff": Row("ffn.linear_0 and linear_1 widths", Marian("encoder_ffn_dim")),
    "num_encoder_layers": Row("TransformerEncoderSpec's layers", Marian("encoder_layers")),
    "num_decoder_layers": Row("TransformerDecoderSpec's layers", Marian("decoder_layers")),
    "dropout_rate": Row("", Marian("dropout")),
    "attention_dropout_rate": Row("", Marian("attention_dropout")),
    "ffn_dropout_rate": Row("", Marian("activation_dropout")),
    "pre_layer_norm": Row("pre_norm; encoder_norm and decoder_norm as the stacks' "
                          "layer_norm", Marian(value=False)),
    "norm": Row("rms_norm; each sublayer's layer_norm", Marian(value="layernorm")),
    "norm_epsilon": Row("config.layer_norm_epsilon", Marian(value=1e-5)),
    "ffn_activation": Row("activation (RELU, GELU, SWISH) and ffn_glu (linear_0 the gate, "
                          "linear_0_noact the up projection)",
                          Marian("activation_function", names=MARIAN_ACTIVATIONS)),
    "num_kv_heads": Row("num_heads_kv", Marian(value=0)),
    "positional_encoding": Row("position_encodings.encodings (our table: interleaved or "
                               "concatenated sinusoids, or the learned one); rotary_dim=0 with "
                               "rotary_interleave=False; relative_attention_bias",
                               Marian(value="sinusoidal_concat")),
    "relative_num_buckets": Row("relative_attention_bias's rows", NOT_MARIAN),
    "relative_max_distance": Row("relative_attention_max_distance", NOT_MARIAN),
    "max_len": Row("position_encodings' rows", Marian("max_position_embeddings")),
    "share_embeddings": Row("encoder.embeddings[0] and decoder.embeddings: one table",
                            Marian(about="the weights say: one embedding table or two")),
    "scale_embeddings": Row("scale_embeddings of both stacks", Marian("scale_embedding")),
    "tie_output_embedding": Row("decoder.projection: the target embedding table",
                                Marian("tie_word_embeddings")),
    "output_bias": Row("decoder.projection.bias (PAD's logit held at -1e4 either way)",
                       Marian(value=True)),
    "qk_norm": Row("qk_norm: self_attention.q_norm and k_norm (RMSNorm over each head's "
                   "dimensions); none in cross-attention",
                   Marian(value=False)),
    "dtype": Row("", Marian(about="float32: what imports are checked in")),
    "attention_impl": Row("", NOT_MARIAN),
    "activation_dtype": Row("", NOT_MARIAN),
    "logits_dtype": Row("", NOT_MARIAN),
    "loss_tile_tokens": Row("", NOT_MARIAN),
    "remat": Row("", NOT_MARIAN),
    "scan_layers": Row("per-layer weights (a scanned run's are unstacked)", NOT_MARIAN),
}


def page() -> str:
  """docs/reference/model-options.md: the table, with each option's effect on weights."""
  lines = ["# Model options across runtimes", "",
           "Each `config.model` option: what it does to trained weights (`shapes`: a checkpoint",
           "of another value does not fit; `function`: what the weights compute depends on it,",
           "so a fine-tuned run keeps its source's value; `free`: how the model",
           "trains or runs), where an exported CTranslate2 model holds it, and what an imported",
           "Hugging Face Marian model's `config.json` says of it. Printed by `python -m",
           "transformer_jax.interop.model_options` from `transformer_jax/interop/",
           "model_options.py`; `tests/unit/interop/test_model_options.py` fails when it",
           "differs.", "",
           "| option | weights | CTranslate2 | Marian |", "|---|---|---|---|"]
  for f in dataclasses.fields(ModelConfig):
    row = ROWS[f.name]
    ct2 = row.ctranslate2 or ("nothing to hold: how the model trains or runs"
                              if f.metadata["weights"] == FREE else "")
    lines.append(f"| `{f.name}` | {f.metadata['weights']} | {ct2} | {row.marian} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(page(), end="")
