"""An exported model translates test2016 as the run does: for the tiny model and the default
model's architecture (trained briefly here; BENCHMARKS.md has the 1,000-step default run),
CTranslate2's greedy translations equal ours on at least 99% of the sentences, and its beam-4
BLEU (the run's length penalty) is within 0.3 of our beam search's.

Both sides decode in float32 with the same length cap (CTranslate2 has no `a * source + b`
cap: ours is set to the fixed one), from the same checkpoint.
"""

import gzip
import json

import ctranslate2
import pytest
import sacrebleu

from tests import caches, helpers
from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import default
from transformer_jax.export import ctranslate2_decoding
from transformer_jax.export.exporter import TOKENIZER_FILE, export
from transformer_jax.inference.translator import Translator
from transformer_jax.training.loop import train_and_evaluate

CORPUS = helpers.ROOT / "transformer_jax" / "corpora" / "multi30k"
RUNS = {  # what each model trains for here (validating only at the end, on 8 sentences)
    "tiny": {"num_train_steps": 300, "checkpoint_every_steps": 300, "data.batch_size": 32},
    "default": {"num_train_steps": 150, "checkpoint_every_steps": 150, "data.batch_size": 16,
                "time_budget_minutes": 0.0},
}
# (a cap of 64 tokens: test2016's references have 13 words on average; a briefly trained
# model's repetitions would otherwise run to the default 128 on both sides)
COMMON = {"eval_every_steps": 1000, "eval_max_sentences": 8, "decode.max_length": 64,
          "data.test_split": ""}


def _lines(name):
  with gzip.open(CORPUS / name, "rt", encoding="utf-8") as f:
    return f.read().splitlines()


def _train(name, workdir, cache, tokenizer):
  c = helpers.with_overrides(helpers.tiny_config() if name == "tiny" else default.get_config(),
                             {**RUNS[name], **COMMON, "data.cache_dir": str(cache)})
  workdir.mkdir(parents=True)
  if name == "tiny":  # (the shared tiny tokenizer; the default one trains its 8k pieces)
    (workdir / "spm.model").write_bytes(tokenizer.read_bytes())
  train_and_evaluate(from_config_dict(c), workdir, c.to_dict())


@pytest.fixture(scope="module", params=sorted(RUNS))
def exported(request, shared_dir, tfds_cache, tiny_tokenizer):
  """(workdir, exported float32 folder) of a briefly trained model, built once per test run
  (the xdist workers that share this file's tests wait for the first one's)."""
  def build(folder):
    _train(request.param, folder / "run", tfds_cache, tiny_tokenizer)
    export(folder / "run", "latest", folder / "ct2")
  folder = caches.built_once(shared_dir / f"export_{request.param}", build)
  return folder / "run", folder / "ct2"


def _both(workdir, folder, decode):
  """Our translations and CTranslate2's of test2016 under the `decode` overrides."""
  sources = _lines("test2016.de.gz")
  length = json.loads((workdir / "config.json").read_text())["decode"]["max_length"]
  ours = Translator(str(workdir), "latest", [*decode, "max_length_a=0",
                                             f"max_length_b={length}"], dtype="float32")
  our_out = [hyps[0][0] if hyps else "" for hyps in ours.translate(sources)]
  options = ctranslate2_decoding.translate_options(ours.decode, ours.run.cfg.model.max_len)
  sp = ours.run.tokenizer.sp
  assert (folder / TOKENIZER_FILE).read_bytes() == ours.run.tokenizer.model_proto
  their_out = ctranslate2_decoding.translate(
      ctranslate2.Translator(str(folder), device="cpu", intra_threads=2), sp, sources, options)
  return our_out, their_out


def test_greedy_translations_equal_ours_on_99_percent_of_test2016(exported):
  ours, theirs = _both(*exported, ["greedy=true"])
  same = sum(a == b for a, b in zip(ours, theirs))
  print(f"greedy: {same}/{len(ours)} equal")
  assert same >= 0.99 * len(ours), (same, [(a, b) for a, b in zip(ours, theirs) if a != b][:3])
  assert len({*ours}) > 50  # (a model that says something, not one sentence for all)


def test_beam_4_bleu_is_within_0_3_of_ours(exported):
  references = [_lines("test2016.en.gz")]
  ours, theirs = _both(*exported, ["beam_size=4"])
  our_bleu = sacrebleu.corpus_bleu(ours, references).score
  their_bleu = sacrebleu.corpus_bleu(theirs, references).score
  print(f"beam 4: BLEU ours {our_bleu:.2f}, CTranslate2 {their_bleu:.2f}")
  assert abs(our_bleu - their_bleu) <= 0.3, (our_bleu, their_bleu)
  assert our_bleu > 0.5
