"""The model variants that the tests of whole models share: each `config.model` option's
values (every choice, the other value of a flag, a number other than the tiny config's), in
few models. A test of every variant (CTranslate2 scoring, cached decoding) then covers every
option; `tests/unit/interop/test_model_options.py` fails when an option is in none."""

# The sizes: every variant has some; a test of other sizes is not a test of an option.
SIZES = ("vocab_size", "d_model", "num_heads", "d_ff", "num_encoder_layers",
         "num_decoder_layers", "max_len")

VARIANTS = {
    "paper_pre_ln": {},
    "post_ln_rmsnorm_gelu_learned_untied": {
        "model.pre_layer_norm": False, "model.norm": "rmsnorm", "model.ffn_activation": "gelu",
        "model.positional_encoding": "learned", "model.share_embeddings": False,
        "model.tie_output_embedding": False},
    "swiglu_gqa_rotary_qk_norm_scanned_3_1": {
        "model.ffn_activation": "swiglu", "model.num_kv_heads": 2,
        "model.positional_encoding": "rotary", "model.scan_layers": True,
        "model.num_encoder_layers": 3, "model.num_decoder_layers": 1, "model.qk_norm": True},
    "geglu_mqa_relative_untied_output": {
        "model.ffn_activation": "geglu", "model.num_kv_heads": 1,
        "model.positional_encoding": "relative", "model.relative_num_buckets": 8,
        "model.relative_max_distance": 20, "model.tie_output_embedding": False},
    "marian_like_silu_concat_sinusoids_unscaled_output_bias": {
        "model.pre_layer_norm": False, "model.ffn_activation": "silu",
        "model.positional_encoding": "sinusoidal_concat", "model.scale_embeddings": False,
        "model.output_bias": True, "model.norm_epsilon": 1e-5},
    "rmsnorm_swiglu_gqa_relative": {
        "model.norm": "rmsnorm", "model.ffn_activation": "swiglu", "model.num_kv_heads": 2,
        "model.positional_encoding": "relative"},
    "post_ln_rmsnorm_geglu_mqa_rotary_qk_norm": {
        "model.pre_layer_norm": False, "model.norm": "rmsnorm", "model.ffn_activation": "geglu",
        "model.num_kv_heads": 1, "model.positional_encoding": "rotary", "model.qk_norm": True},
}


def model_fields(name: str) -> dict:
  """Variant `name` as ModelConfig fields (without the "model." of its config keys)."""
  return {key.removeprefix("model."): value for key, value in VARIANTS[name].items()}
