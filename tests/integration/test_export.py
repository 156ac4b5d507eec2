"""An exported model translates test2016 as the run does: for the tiny model trained briefly
here, the CTranslate2 engine's greedy translations of the first 500 sentences equal ours on
at least 99% of them, each sentence at the run's own length cap (min(max_length, a * source +
b): the engine gives it to CTranslate2, whose briefly trained model's repetitions run to it),
and its beam-4 BLEU (the run's length penalty) is within 0.3 of our beam search's.
(Every model option converts exactly, score_batch against our log-probabilities:
tests/unit/export; the default model's 1,000-step run served by CTranslate2: BENCHMARKS.md.)

Both sides decode in float32 from the same checkpoint; beam search through the exported
folder directly, at one fixed length cap (`translate_batch` alone has no `a * source + b`).
"""

import concurrent.futures
import dataclasses
import gzip
import json

import ctranslate2
import pytest
import sacrebleu

from tests import builders, helpers
from transformer_jax.cli import translate as translate_cli
from transformer_jax.cli import translate_corpus as translate_corpus_cli
from transformer_jax.errors import ConfigError, UsageError
from transformer_jax.inference.checkpoint_eval import evaluate_checkpoints
from transformer_jax.inference.translator import Translator
from transformer_jax.interop import ctranslate2_decoding, engines
from transformer_jax.interop.ctranslate2_export import TOKENIZER_FILE
from transformer_jax.serving.service import Options, Service

CORPUS = helpers.ROOT / "transformer_jax" / "corpora" / "multi30k"
SENTENCES = 500  # the first of test2016's 1,000


def _lines(name):
  with gzip.open(CORPUS / name, "rt", encoding="utf-8") as f:
    return f.read().splitlines()


@pytest.fixture(scope="module")
def exported():
  """(workdir, exported float32 folder) of the tiny model trained for 300 steps
  (tests/builders.py: built in the background at the start of a test run)."""
  folder = builders.get("exported")
  return folder / "run", folder / "ct2"


def _both(workdir, folder, decode):
  """Our translations and CTranslate2's of test2016 under the `decode` overrides."""
  sources = _lines("test2016.de.gz")[:SENTENCES]
  length = json.loads((workdir / "config.json").read_text())["decode"]["max_length"]
  ours = Translator(str(workdir), "latest", [*decode, "max_length_a=0",
                                             f"max_length_b={length}"], dtype="float32")
  our_out = [hyps[0].text if hyps else "" for hyps in ours.translate(sources)]
  assert (folder / TOKENIZER_FILE).read_bytes() == ours.run.tokenizer.model_proto
  theirs = engines.Ctranslate2Engine(folder, ours.run.tokenizer, ours.decode,
                                     ours.run.cfg.model.max_len, compute_type="float32")
  their_out = [hyps[0].text if hyps else "" for hyps in theirs.translate(sources)]
  return our_out, their_out


def _raw(folder, tokenizer, sources, decode, max_len):
  """CTranslate2's own best translations of `sources` (translate_batch with `decode`'s
  arguments, no engine between), to hold the engine to."""
  results = ctranslate2.Translator(str(folder), device="cpu").translate_batch(
      [tokenizer.sp.encode(s, out_type=str) for s in sources],
      **ctranslate2_decoding.translate_options(decode, max_len))
  return [tokenizer.sp.decode(r.hypotheses[0]) for r in results]


def test_greedy_translations_equal_ours_on_99_percent_of_test2016(exported, monkeypatch):
  workdir, folder = exported
  sources = _lines("test2016.de.gz")[:SENTENCES]
  monkeypatch.setattr(engines, "cached_export", lambda run, selected: folder)
  caps = ["greedy=true"]  # (the run's per-sentence caps: max_length_a=1.5, max_length_b=10)
  engine = engines.ctranslate2_translator(str(workdir), "latest", caps,
                                          requested_type="float32")
  ours = [h[0].text if h else "" for h in Translator(str(workdir), "latest", caps,
                                                      dtype="float32").translate(sources)]
  theirs = [h[0].text if h else "" for h in engine.translate(sources)]
  assert (engine.decode.max_length_a, engine.decode.max_length_b) == (1.5, 10)
  same = sum(a == b for a, b in zip(ours, theirs))
  print(f"greedy: {same}/{len(ours)} equal")
  assert same >= 0.99 * len(ours), (same, [(a, b) for a, b in zip(ours, theirs) if a != b][:3])
  assert len({*ours}) > 50  # (a model that says something, not one sentence for all)


def _repeated_bigrams(ids) -> int:
  grams = list(zip(ids, ids[1:]))
  return len(grams) - len(set(grams))


@pytest.mark.parametrize("option", ["no_repeat_ngram_size=2", "repetition_penalty=1.5"])
def test_ctranslate2_honours_the_repetition_options_as_ours(exported, monkeypatch, option):
  """Greedy, so that the two engines' length penalties play no part: with each option both
  give the same translations of test2016's first 100 sentences (as without it), and the
  option changes many of them."""
  workdir, folder = exported
  sources = _lines("test2016.de.gz")[:100]
  monkeypatch.setattr(engines, "cached_export", lambda run, selected: folder)
  decode = ["greedy=true", option]
  engine = engines.ctranslate2_translator(str(workdir), "latest", decode,
                                          requested_type="float32")
  ours = Translator(str(workdir), "latest", decode, dtype="float32")
  our_hyps = [h[0] for h in ours.translate(sources)]
  their_hyps = [h[0] for h in engine.translate(sources)]
  same = sum(a.ids == b.ids for a, b in zip(our_hyps, their_hyps))
  assert same >= 0.99 * len(sources), [(a.text, b.text) for a, b in zip(our_hyps, their_hyps)
                                       if a.ids != b.ids][:3]
  plain = Translator(str(workdir), "latest", ["greedy=true"], dtype="float32")
  changed = sum(a.ids != h[0].ids for a, h in zip(our_hyps, plain.translate(sources)))
  print(f"{option}: {same}/{len(sources)} equal, {changed} changed by it")
  assert changed >= 0.05 * len(sources)
  if option.startswith("no_repeat"):
    assert sum(_repeated_bigrams(h.ids) for h in our_hyps + their_hyps) == 0


def test_beam_4_bleu_is_within_0_3_of_ours(exported):
  references = [_lines("test2016.en.gz")[:SENTENCES]]
  ours, theirs = _both(*exported, ["beam_size=4"])
  our_bleu = sacrebleu.corpus_bleu(ours, references).score
  their_bleu = sacrebleu.corpus_bleu(theirs, references).score
  print(f"beam 4: BLEU ours {our_bleu:.2f}, CTranslate2 {their_bleu:.2f}")
  assert abs(our_bleu - their_bleu) <= 0.3, (our_bleu, their_bleu)
  assert our_bleu > 0.5


def test_the_ctranslate2_engine_exports_once_and_translates_as_the_export(exported, tmp_path,
                                                                          monkeypatch):
  """`--engine=ctranslate2`: the checkpoint exported into the cache on first use (the same
  translations as the exported folder the tests above hold to ours), reused after under any
  name of the same checkpoint; the server's engine on it; what it cannot do refused in one
  line."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  workdir, folder = exported
  sources = _lines("test2016.de.gz")[:100]
  first = engines.translator("ctranslate2", [str(workdir)], compute_type="float32")
  (cached,) = [p for p in (tmp_path / "transformer_jax" / "ctranslate2").iterdir()
               if not p.name.startswith(".")]  # (and the export's lock file)
  made = (cached / "model.bin").stat().st_mtime_ns
  step = json.loads((cached / "export.json").read_text())["steps"][0]
  greedy = ["greedy=true", "max_length_a=0", f"max_length_b={first.decode.max_length}"]
  again = engines.ctranslate2_translator(str(workdir), str(step), greedy,
                                          requested_type="float32", calls_at_once=2)
  assert (cached / "model.bin").stat().st_mtime_ns == made  # (from the cache)
  translated = again.translate(sources)
  expected = _raw(folder, first.run.tokenizer, sources, again.decode,
                  again.run.cfg.model.max_len)
  assert [h[0].text for h in translated] == expected
  assert [first.run.tokenizer.detokenize(list(h[0].ids)) for h in translated] == expected
  # (a server's two workers: two calls at once, each on its own CTranslate2 thread)
  assert again.engine.backend.num_translators == 2
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    halves = list(pool.map(again.translate, [sources[:50], sources[50:]]))
  assert [h[0].text for half in halves for h in half] == expected
  served = Service(again).translate(sources[:4], [""] * 4, Options())
  assert [answer.hypotheses[0]["translation"] for answer in served] == expected[:4]
  # (whether a translation ended, or its cap stopped it, as our search says it: at a cap of
  # 16 subwords some end, some do not)
  capped = again.translate(sources, decode=dataclasses.replace(again.decode, max_length=16))
  assert all(h[0].ended == (len(h[0].ids) < 16) and len(h[0].ids) <= 16 for h in capped)
  assert {h[0].ended for h in capped} == {True, False}
  assert [h[0].ended for h in translated] == [len(h[0].ids) < again.decode.max_length
                                              for h in translated]
  with pytest.raises(ConfigError, match="alignments: not with the ctranslate2 engine"):
    Service(again).decode_config(Options(alignments=True))
  with pytest.raises(ConfigError, match="--compute_type=float64: CTranslate2 on this cpu "
                                        "supports"):
    engines.compute_type("float64")
  with pytest.raises(UsageError, match="--alignments: not with --engine=ctranslate2"):
    engines.translator("ctranslate2", [str(workdir)], alignments=True)
  with pytest.raises(UsageError, match="samples from one seed per process"):
    again.translate(sources[:1], seed=1, decode=dataclasses.replace(again.decode, greedy=False,
                                                                    sampling=True))
  with pytest.raises(UsageError, match="--compute_type is CTranslate2's"):
    engines.translator("jax", [str(workdir)], compute_type="int8")


def test_evaluate_scores_with_the_ctranslate2_engine(exported, tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  workdir, folder = exported
  cap = ["max_length_a=0", "max_length_b=64"]  # (one cap, as translate_batch alone takes)
  (result,), _ = evaluate_checkpoints(
      str(workdir), "test2016", "latest", max_sentences=100, output_dir=str(tmp_path / "eval"),
      engines=engines.evaluation_engines(["ctranslate2"], "float32"), lowercase=True,
      decode_overrides=cap)
  assert result["label"].endswith("@ctranslate2") and result["engine"] == "ctranslate2"
  run = Translator(str(workdir), decode_overrides=cap)  # (the settings evaluate decodes with)
  # (what CTranslate2 ran, recorded: its length penalty's formula is not ours)
  assert result["engine_settings"]["translate_batch"]["length_penalty"] == 0.6
  assert [n.split(":")[0] for n in result["engine_settings"]["differences"]] == [
      "length_penalty=0.6"]
  sources = _lines("test2016.de.gz")[:100]
  expected = _raw(folder, run.run.tokenizer, sources, run.decode, run.run.cfg.model.max_len)
  hyps = (tmp_path / "eval" / f"{result['label']}.hyp").read_text().splitlines()
  assert hyps == expected
  references = [_lines("test2016.en.gz")[:100]]
  assert result["bleu"] == sacrebleu.corpus_bleu(expected, references).score
  assert result["bleu_lowercase"] == sacrebleu.corpus_bleu(expected, references,
                                                           lowercase=True).score
  with pytest.raises(UsageError, match="--engine=ctranslate2: no --alignments"):
    evaluate_checkpoints(str(workdir), "test2016", "latest", alignments=True,
                         engines=engines.evaluation_engines(["ctranslate2"]))


def test_translate_and_translate_corpus_take_the_ctranslate2_engine(exported, tmp_path,
                                                                   monkeypatch):
  """`translate --engine=ctranslate2` prints the export's translations in translate's layout
  (n-best, empty lines kept); `translate-corpus` writes them as its corpus, records the engine
  and refuses to go on in a folder another engine began."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  workdir, folder = exported
  sources = _lines("test2016.de.gz")[:6]
  lines = sources[:3] + [""] + sources[3:]
  decode = ["--decode=max_length_a=0", "--decode=max_length_b=64"]
  status, out, err = helpers.run_tool(
      translate_cli.main, f"--workdir={workdir}", "--engine=ctranslate2", "--interactive=false",
      "--compute_type=float32", "--decode=nbest=2", *decode,
      stdin=("\n".join(lines) + "\n").encode())
  assert status == 0, err[-2000:]
  rows = [line.split(" ||| ") for line in out.splitlines()]
  run = Translator(str(workdir), decode_overrides=["nbest=2", "max_length_a=0",
                                                   "max_length_b=64"])
  theirs = ctranslate2.Translator(str(folder), device="cpu").translate_batch(
      [run.run.tokenizer.sp.encode(s, out_type=str) for s in sources],
      **ctranslate2_decoding.translate_options(run.decode, run.run.cfg.model.max_len))
  expected = [[str(i), run.run.tokenizer.sp.decode(h), f"{s:.4f}"]
              for i, r in zip([0, 1, 2, 4, 5, 6], theirs)
              for h, s in zip(r.hypotheses, r.scores)]
  assert [r for r in rows if r[0] != "3"] == expected
  assert [r for r in rows if r[0] == "3"] == [["3", "", "0.0000"]] * 2  # (nbest lines each)

  source = tmp_path / "mono.de"
  source.write_text("\n".join(lines) + "\n")
  corpus = [f"--workdir={workdir}", f"--input={source}", f"--out={tmp_path / 'bt'}",
            "--engine=ctranslate2", "--compute_type=float32", *decode]
  status, _, err = helpers.run_tool(translate_corpus_cli.main, *corpus)
  assert status == 0, err[-2000:]
  best = [r[1] for r in rows if r[0] != "3"][::2]
  assert (tmp_path / "bt" / "train.en").read_text().splitlines() == best[:3] + [""] + best[3:]
  assert json.loads((tmp_path / "bt" / "translation.json").read_text())["engine"] == \
      "ctranslate2:float32"
  status, _, err = helpers.run_tool(translate_corpus_cli.main, *corpus[:3], *decode)
  assert status != 0 and "holds a finished translation with other engine" in \
      helpers.one_line_error(err)
