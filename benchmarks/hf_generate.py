"""Hugging Face `generate` on the PyTorch peer's decode shape with EOS allowed (run by
decode_speed.py --shape=small --eos=allowed in a Python with torch and transformers).

The model is the peer's (../shared/peers/torch_peer.py --mode decode): a randomly initialised
MarianMTModel, d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 8000; 64 random sources of
32 tokens, beam 4, alpha 0.6, at most 32 new tokens; here without min_new_tokens, so a
hypothesis may end with EOS. Prints one JSON line: sentences/s (median of `--runs` calls) and
how many outputs ended before the cap.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import MarianConfig, MarianMTModel

PAD_ID, EOS_ID, FIRST_REAL_ID = 0, 2, 3


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--runs", type=int, default=5)
  p.add_argument("--max_new_tokens", type=int, default=32)
  args = p.parse_args()
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  cfg = MarianConfig(
      vocab_size=8000, decoder_vocab_size=8000, d_model=256, encoder_layers=3, decoder_layers=3,
      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
      decoder_ffn_dim=1024, activation_function="relu", dropout=0.1, max_position_embeddings=512,
      scale_embedding=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
      decoder_start_token_id=PAD_ID, bos_token_id=None, forced_eos_token_id=None,
      share_encoder_decoder_embeddings=True, tie_word_embeddings=True, use_cache=True)
  model = MarianMTModel(cfg).eval()
  src = torch.randint(FIRST_REAL_ID, 8000, (64, 32), generator=torch.Generator().manual_seed(2))

  def generate():
    with torch.inference_mode():
      return model.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=4,
                            length_penalty=0.6, max_new_tokens=args.max_new_tokens,
                            do_sample=False, use_cache=True, num_return_sequences=1)

  generate()
  times = []
  for _ in range(args.runs):
    t = time.perf_counter()
    out = generate()
    times.append(time.perf_counter() - t)
  lengths = (out[:, 1:] != PAD_ID).sum(dim=1)  # (after the decoder start token)
  ended = int(((out[:, 1:] == EOS_ID).any(dim=1) & (lengths < args.max_new_tokens)).sum())
  mean_length = round(float(lengths.float().mean()), 2)
  print(json.dumps({"sentences_per_s": round(64 / statistics.median(times), 2),
                    "ended_before_cap": ended, "mean_length": mean_length,
                    "torch": torch.__version__}))


if __name__ == "__main__":
  main()
