"""Hugging Face Marian (OPUS-MT) model folders with random weights, made by transformers itself
(save_pretrained) with given SentencePiece models: what the import tests read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel

from transformer_jax.data.tokenizer import Tokenizer

# The tiny config's data and decoding sizes, for a fine-tuning run of an imported model.
TINY_DATA = {"data.batch_size": 16, "data.max_source_length": 32, "data.max_target_length": 32,
             "data.test_split": "", "eval_max_sentences": 32, "model.dtype": "float32",
             "decode.beam_size": 2, "decode.max_length": 32}


def vocabulary(*spm_paths: Path, tags: tuple[str, ...] = ()) -> list[str]:
  """Marian's vocabulary of the SentencePiece models' pieces: EOS 0, UNK 1, the target-language
  tags (a multilingual model's), the pieces, PAD last."""
  pieces = {}
  for path in spm_paths:
    tok = Tokenizer.load(path)
    pieces.update(dict.fromkeys(tok.pieces(range(3, tok.vocab_size))))
  return ["</s>", "<unk>", *tags, *pieces, "<pad>"]


def folder(out: Path, source_spm: Path, target_spm: Path, d_model: int = 16, seed: int = 0,
           tags: tuple[str, ...] = (), **options) -> MarianMTModel:
  """A MarianMTModel with random weights (every tensor, the logits bias included, far from
  its initial value) saved in `out` as an OPUS-MT folder is: save_pretrained, source.spm,
  target.spm, vocab.json (with `tags`: a target-multilingual model's). `options`: MarianConfig
  keys."""
  vocab = vocabulary(source_spm, target_spm, tags=tags)
  V = len(vocab)
  config = MarianConfig(
      vocab_size=V, decoder_vocab_size=V, d_model=d_model, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
      max_position_embeddings=64, pad_token_id=V - 1, eos_token_id=0,
      decoder_start_token_id=V - 1, forced_eos_token_id=0, **options)
  torch.manual_seed(seed)
  model = MarianMTModel(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "embed_positions" in name:  # (the fixed sinusoid table, which is not saved)
        continue
      p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "layer_norm.weight" in name else 0.0))
    model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
  model.save_pretrained(out)
  shutil.copy(source_spm, out / "source.spm")
  shutil.copy(target_spm, out / "target.spm")
  (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(vocab)}))
  return model
