"""Hugging Face Marian models (the ~1,500 OPUS-MT models) as our model's options and weights.

A model folder holds config.json, model.safetensors (or pytorch_model.bin), source.spm,
target.spm and vocab.json. The architecture is the paper's post-LN Transformer with Marian's
choices, each an option of ours: SiLU feed-forward ("swish"), LayerNorm epsilon 1e-5, the
concatenated sinusoid table, embeddings scaled by sqrt(d_model), a bias on the output logits
(final_logits_bias), biases on every projection (ours have them).

Weights (PyTorch Linear weights are (out, in); our kernels (in, out), heads split out):
  model.shared.weight (or {encoder,decoder}.embed_tokens)  -> source_embedding (rows in our order)
  model.decoder.embed_tokens (not shared)                  -> target_embedding
  layers.i.self_attn.{q,k,v}_proj                          -> {encoder,decoder}_i/self_attention/
                                                              {query,key,value} (D -> H, K)
  layers.i.self_attn.out_proj                              -> .../output ((H, K) -> D)
  layers.i.encoder_attn.*                                  -> decoder_i/cross_attention/*
  layers.i.{self_attn,encoder_attn,final}_layer_norm       -> {self_attention,attention,
                                                              cross_attention,ffn}_block/layer_norm
  layers.i.fc1, fc2                                        -> feed_forward/wi, wo
  lm_head.weight (untied)                                  -> output_projection
  final_logits_bias                                        -> output_logits_bias
Token ids are reordered so that PAD, EOS and UNK are our 0, 1, 2 (Marian: EOS 0, UNK 1, PAD
last); the decoder starts from PAD in both. Anything else in the files is refused by name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from transformer_jax.data.tokenizer import LANGUAGE_TAG, PairedTokenizer
from transformer_jax.errors import CheckpointError
from transformer_jax.interop import imported_run, safetensors
from transformer_jax.interop.model_options import MARIAN_ACTIVATIONS, ROWS
from transformer_jax.model.embeddings import sinusoidal_positions

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SPECIAL_PIECES = ("<pad>", "</s>", "<unk>")  # our ids 0, 1, 2
# The config keys read here, and those that change nothing computed (generation defaults,
# bookkeeping, and BART-era options that Marian's code ignores); any other key is refused.
# What MarianConfig takes for a key the file leaves out.
DEFAULTS = {"max_position_embeddings": 1024, "activation_function": "gelu", "dropout": 0.1,
            "attention_dropout": 0.0, "activation_dropout": 0.0, "scale_embedding": False,
            "pad_token_id": 58100, "eos_token_id": 0, "decoder_start_token_id": 58100,
            "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
            "decoder_vocab_size": None}
READ_KEYS = {
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "dropout",
    "attention_dropout", "activation_dropout", "activation_function", "max_position_embeddings",
    "scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings",
    "decoder_vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id"}
IGNORED_KEYS = {
    "is_decoder", "add_cross_attention", "finetuning_task", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "output_past", "_name_or_path", "architectures", "model_type",
    "transformers_version", "torch_dtype", "dtype", "_num_labels", "classif_dropout",
    "bad_words_ids", "bos_token_id", "forced_eos_token_id", "max_length", "num_beams",
    "num_hidden_layers", "use_cache", "is_encoder_decoder", "classifier_dropout", "init_std",
    "encoder_layerdrop", "decoder_layerdrop", "normalize_embedding", "add_bias_logits",
    "add_final_layer_norm", "extra_pos_embeddings", "normalize_before",
    "static_position_embeddings", "gradient_checkpointing", "id2label", "label2id",
    "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
    "tie_encoder_decoder", "pruned_heads", "tokenizer_class", "prefix", "task_specific_params",
    "problem_type", "unk_token_id", "sep_token_id", "cls_token_id", "mask_token_id",
    "num_labels", "output_scores", "length_penalty", "early_stopping", "do_sample",
    "min_length", "no_repeat_ngram_size", "num_return_sequences", "temperature", "top_k",
    "top_p", "repetition_penalty", "diversity_penalty", "num_beam_groups", "suppress_tokens",
    "begin_suppress_tokens"}


def refuse(model_dir: Path, what: str):
  raise CheckpointError(f"{model_dir}: {what}; this Marian model cannot be imported")


def read_config(model_dir: Path) -> dict:
  path = model_dir / "config.json"
  if not path.is_file():
    raise CheckpointError(f"{model_dir} has no config.json: not a Hugging Face model folder")
  try:
    config = json.loads(path.read_text())
  except ValueError as e:
    raise CheckpointError(f"{path} is not JSON ({e})") from None
  if config.get("model_type") != "marian":
    refuse(model_dir, f"config.json model_type={config.get('model_type')!r} (only 'marian')")
  # (keys that begin with "_" are transformers' bookkeeping, e.g. _attn_implementation_autoset
  # in a config saved again from a loaded model: none changes what the model computes)
  unknown = sorted(k for k in set(config) - READ_KEYS - IGNORED_KEYS if not k.startswith("_"))
  if unknown:
    refuse(model_dir, f"config.json key {unknown[0]!r} has no equivalent here")
  config = {**DEFAULTS, **config}
  if config["decoder_vocab_size"] is None:
    config["decoder_vocab_size"] = config.get("vocab_size")
  missing = [k for k in ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
                         "encoder_attention_heads", "encoder_ffn_dim") if k not in config]
  if missing:
    refuse(model_dir, f"config.json lacks {missing[0]}")
  return config


def model_options(hf: dict, model_dir: Path) -> dict:
  """Our config.model values for Marian config `hf`, as each option's row says
  (`model_options.ROWS`; share_embeddings: the weights tell); a one-line refusal naming the
  first key whose value we do not compute."""
  for ours, theirs in (("encoder_attention_heads", "decoder_attention_heads"),
                       ("encoder_ffn_dim", "decoder_ffn_dim")):
    if hf.get(ours) != hf.get(theirs):
      refuse(model_dir, f"{theirs}={hf.get(theirs)} differs from {ours}={hf.get(ours)} (one "
             "value for both stacks here)")
  activation = hf["activation_function"]
  if activation not in MARIAN_ACTIVATIONS:
    refuse(model_dir, f"activation_function={activation!r}")
  shared = hf["share_encoder_decoder_embeddings"]
  if not shared and hf["decoder_vocab_size"] != hf["vocab_size"]:
    refuse(model_dir, f"decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size="
           f"{hf['vocab_size']} (separate source and target vocabularies)")
  return {name: row.marian.read(hf) for name, row in ROWS.items() if row.marian.given}


def read_weights(model_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
  """(the file read, its tensors as numpy arrays); safetensors needs no torch."""
  for name in WEIGHT_FILES:
    path = model_dir / name
    if not path.is_file():
      continue
    if name.endswith(".safetensors"):
      return path, safetensors.load(path)
    try:
      import torch  # noqa: PLC0415 (optional: only pytorch_model.bin needs it)
    except ImportError:
      raise CheckpointError(f"{path} is a PyTorch pickle, which needs torch (pip install "
                            "torch), or convert it to model.safetensors") from None
    state = torch.load(path, map_location="cpu", weights_only=True)
    return path, {k: v.float().numpy() for k, v in state.items()}
  raise CheckpointError(f"{model_dir} has neither {' nor '.join(WEIGHT_FILES)}")


def vocabulary(model_dir: Path, hf: dict) -> tuple[list[int], list[str]]:
  """(Marian id of each of our ids, our pieces by id): PAD, EOS, UNK first, then the rest in
  Marian's order; ids vocab.json leaves unnamed get unique placeholders."""
  if (model_dir / "target_vocab.json").is_file():
    refuse(model_dir, "target_vocab.json (separate source and target vocabularies)")
  path = model_dir / "vocab.json"
  if not path.is_file():
    raise CheckpointError(f"{model_dir} has no vocab.json (Marian's shared vocabulary)")
  pieces = {i: f"<unused_{i}>" for i in range(hf["vocab_size"])}
  named = {}
  for piece, i in json.loads(path.read_text()).items():
    if not 0 <= i < hf["vocab_size"]:
      refuse(model_dir, f"vocab.json gives {piece!r} id {i}, outside vocab_size "
             f"{hf['vocab_size']}")
    if i in named:  # (one piece per id here; transformers maps both to it)
      refuse(model_dir, f"vocab.json gives {named[i]!r} and {piece!r} the same id {i}")
    pieces[i] = named[i] = piece
  ids = {piece: i for i, piece in pieces.items()}
  special = [hf["pad_token_id"], hf["eos_token_id"], ids.get("<unk>")]
  for name, i, piece in zip(("pad_token_id", "eos_token_id", "<unk>"), special, SPECIAL_PIECES):
    if i is None or pieces.get(i) != piece:
      refuse(model_dir, f"{name} is not the piece {piece!r} in vocab.json")
  if hf["decoder_start_token_id"] != special[0]:
    refuse(model_dir, f"decoder_start_token_id={hf['decoder_start_token_id']} is not the "
           f"padding id {special[0]} (the decoder starts from padding here)")
  order = special + [i for i in range(hf["vocab_size"]) if i not in special]
  return order, [pieces[i] for i in order]


def tokenizer_file(model_dir: Path, pieces: list[str]) -> bytes:
  for name in ("source.spm", "target.spm"):
    if not (model_dir / name).is_file():
      raise CheckpointError(f"{model_dir} has no {name} (Marian's SentencePiece models)")
  return PairedTokenizer.bundle((model_dir / "source.spm").read_bytes(),
                                (model_dir / "target.spm").read_bytes(), pieces)


class _Weights:
  """The checkpoint's tensors, each taken once: what is left at the end was not mapped."""

  def __init__(self, tensors: dict[str, np.ndarray], model_dir: Path):
    prefixed = all(k.startswith("model.") or k in ("lm_head.weight", "final_logits_bias")
                   for k in tensors)
    self.tensors = {k.removeprefix("model.") if prefixed else k: np.asarray(v, np.float32)
                    for k, v in tensors.items()}
    self.model_dir = model_dir

  def take(self, *names: str) -> np.ndarray:
    """The first of `names` present (tied copies: the others are dropped with it)."""
    found = [n for n in names if n in self.tensors]
    if not found:
      raise CheckpointError(f"{self.model_dir}: the weights lack {names[0]}")
    value = self.tensors[found[0]]
    for name in found:
      del self.tensors[name]
    return value

  def linear(self, name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict:
    weight, bias = self.take(f"{name}.weight"), self.take(f"{name}.bias")
    return {"kernel": weight.T.reshape(in_shape + out_shape), "bias": bias.reshape(out_shape)}

  def norm(self, name: str) -> dict:
    return {"scale": self.take(f"{name}.weight"), "bias": self.take(f"{name}.bias")}


def _attention(w: _Weights, name: str, options: dict) -> dict:
  D, H = options["d_model"], options["num_heads"]
  K = D // H
  params = {ours: w.linear(f"{name}.{theirs}_proj", (D,), (H, K))
            for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"))}
  params["output"] = w.linear(f"{name}.out_proj", (H, K), (D,))
  return params


def _feed_forward(w: _Weights, name: str, options: dict) -> dict:
  D, F = options["d_model"], options["d_ff"]
  return {"wi": w.linear(f"{name}.fc1", (D,), (F,)), "wo": w.linear(f"{name}.fc2", (F,), (D,))}


def convert(tensors: dict[str, np.ndarray], options: dict, order: list[int],
            model_dir: Path) -> dict:
  """Our parameter tree (per-layer layout, f32) from the Marian checkpoint's tensors (one
  embedding table, or a target_embedding too where the stacks' tables differ)."""
  w = _Weights(tensors, model_dir)
  # Each stack's own table where the file has it (transformers unties all three when
  # tie_word_embeddings is off), else the shared one; one table of ours when they are equal.
  shared = w.tensors.pop("shared.weight", None)
  source = w.tensors.pop("encoder.embed_tokens.weight", shared)
  target = w.tensors.pop("decoder.embed_tokens.weight", shared)
  if source is None or target is None:
    raise CheckpointError(f"{model_dir}: the weights lack shared.weight (the embeddings)")
  params = {"source_embedding": {"embedding": source[order]}}
  if not np.array_equal(source, target):
    params["target_embedding"] = {"embedding": target[order]}
  for stack in ("encoder", "decoder"):
    for name in (f"{stack}.embed_positions.weight",):  # (recomputed; checked if saved)
      if name in w.tensors:
        saved = w.take(name)
        ours = sinusoidal_positions(saved.shape[0], saved.shape[1], concat=True)
        if not np.allclose(saved, ours, atol=1e-4):
          refuse(model_dir, f"{name} is not Marian's sinusoid table")
  for i in range(options["num_encoder_layers"]):
    layer = f"encoder.layers.{i}"
    params[f"encoder_{i}"] = {
        "self_attention": _attention(w, f"{layer}.self_attn", options),
        "attention_block": {"layer_norm": w.norm(f"{layer}.self_attn_layer_norm")},
        "feed_forward": _feed_forward(w, layer, options),
        "ffn_block": {"layer_norm": w.norm(f"{layer}.final_layer_norm")}}
  for i in range(options["num_decoder_layers"]):
    layer = f"decoder.layers.{i}"
    params[f"decoder_{i}"] = {
        "self_attention": _attention(w, f"{layer}.self_attn", options),
        "self_attention_block": {"layer_norm": w.norm(f"{layer}.self_attn_layer_norm")},
        "cross_attention": _attention(w, f"{layer}.encoder_attn", options),
        "cross_attention_block": {"layer_norm": w.norm(f"{layer}.encoder_attn_layer_norm")},
        "feed_forward": _feed_forward(w, layer, options),
        "ffn_block": {"layer_norm": w.norm(f"{layer}.final_layer_norm")}}
  if options["tie_output_embedding"]:
    w.tensors.pop("lm_head.weight", None)  # (a tied copy of the target table, when saved)
  else:
    params["output_projection"] = {"kernel": w.take("lm_head.weight")[order].T}
  bias = w.tensors.pop("final_logits_bias", np.zeros((1, options["vocab_size"]), np.float32))
  params["output_logits_bias"] = bias.reshape(-1)[order]
  if w.tensors:
    refuse(model_dir, f"weight {sorted(w.tensors)[0]!r} has no place in the model")
  return params


def import_run(model_dir: str | Path, workdir: str | Path, source_lang: str,
               target_lang: str) -> Path:
  """Reads the Marian model in `model_dir` and writes it as the workdir `workdir`."""
  model_dir = Path(model_dir)
  if not model_dir.is_dir():
    raise CheckpointError(f"--model_dir={model_dir} is not a folder")
  hf = read_config(model_dir)
  options = model_options(hf, model_dir)
  order, pieces = vocabulary(model_dir, hf)
  tokenizer_bytes = tokenizer_file(model_dir, pieces)
  weights_path, tensors = read_weights(model_dir)
  params = convert(tensors, options, order, model_dir)
  options["share_embeddings"] = "target_embedding" not in params  # (what the weights say)
  record = {"format": "hf-marian", "model_dir": str(model_dir.absolute()),
            "weights": weights_path.name, "weights_sha256": imported_run.file_digest(weights_path),
            "source_lang": source_lang, "target_lang": target_lang,
            "ids": "Marian's, reordered: its PAD, EOS and UNK are our 0, 1, 2",
            # (a target-multilingual model: each source starts with the tag of its language)
            "target_language_tags": [p for p in pieces if LANGUAGE_TAG.fullmatch(p)]}
  workdir = imported_run.write_run(workdir, options, (source_lang, target_lang), params,
                             tokenizer_bytes, record)
  tags = record["target_language_tags"]
  if tags:
    log.info("A multilingual model of %d target-language tags (%s%s; all in %s): translate and "
             "evaluate with --source_tag=%s, or start each source line with its tag", len(tags),
             ", ".join(tags[:8]), ", ..." if len(tags) > 8 else "",
             workdir / imported_run.RECORD, tags[0])
  return workdir
