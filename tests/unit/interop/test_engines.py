"""The CTranslate2 engine: its export cache (a checkpoint exported once per version of the code
that exports it, the package's source, as the program store keys its programs); the options
it honours around CTranslate2 as ours does (each sentence's length cap, MBR), what it runs
recorded and its differences said, what it cannot do refused in one line (on a stand-in
CTranslate2)."""

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests import helpers
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.decoding.batches import Hypothesis, sentence_caps
from transformer_jax.decoding.mbr import mbr_order
from transformer_jax.errors import UsageError
from transformer_jax.interop import ctranslate2_export, engines
from transformer_jax.parallel import program_store
from transformer_jax.workdir.checkpoint_selection import Selected


def test_an_export_is_reused_by_the_same_code_and_made_again_by_other_code(tmp_path,
                                                                            monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  (tmp_path / "run" / "checkpoints" / "10").mkdir(parents=True)
  run = SimpleNamespace(workdir=tmp_path / "run",
                        cfg=SimpleNamespace(optimizer=SimpleNamespace(ema_decay=0.0)))
  exports = []

  def export(workdir, label, folder, quantization, force, wait_seconds):
    exports.append((label, folder))
    (folder / "export.json").parent.mkdir(parents=True)
    (folder / "export.json").write_text("{}")
  monkeypatch.setattr(ctranslate2_export, "export", export)
  monkeypatch.setattr(program_store, "source_digest", lambda: "the converter as released")
  first = engines.cached_export(run, Selected("step_10", [10]))
  assert engines.cached_export(run, Selected("latest", [10])) == first
  monkeypatch.setattr(program_store, "source_digest", lambda: "the converter fixed")
  fixed = engines.cached_export(run, Selected("step_10", [10]))
  assert fixed != first and exports == [("step_10", first), ("step_10", fixed)]
  assert (fixed / "export.json").is_file() and (first / "export.json").is_file()


class _Result:
  def __init__(self, hypotheses, scores):
    self.hypotheses, self.scores = hypotheses, scores


class _Ctranslate2:
  """A stand-in for ctranslate2.Translator: records each call's sources and keywords and
  answers `answer(pieces, keywords)` (the n-best as piece lists, ended with EOS)."""
  def __init__(self, answer):
    self.answer, self.calls = answer, []

  def translate_batch(self, tokens, target_prefix=None, **keywords):
    self.calls.append((tokens, target_prefix, keywords))
    out = []
    for pieces in tokens:
      hyps = self.answer(pieces, keywords)
      out.append(_Result(hyps, [-float(k) for k in range(len(hyps))]))
    return out


def _engine(monkeypatch, tokenizer_path, answer, **decode):
  """A CTranslate2 engine of the tiny config (config.decode with `decode`) whose CTranslate2
  is `_Ctranslate2(answer)` (its `translator`)."""
  import ctranslate2
  cfg = helpers.tiny_train_config(**{f"decode.{k}": v for k, v in decode.items()})
  run = SimpleNamespace(cfg=cfg, tokenizer=Tokenizer.load(tokenizer_path), workdir="run",
                        source_prefix=lambda tag: [],
                        select_one=lambda checkpoint, what: Selected("step_1", [1]))
  monkeypatch.setattr(engines, "cached_export", lambda run, selected: Path("export"))
  stub = _Ctranslate2(answer)
  monkeypatch.setattr(ctranslate2, "Translator", lambda *args, **kwargs: stub)
  make = engines.evaluation("float32")

  def translate(run, selected, eval_set, decode):
    """(evaluate's use: the engine made, each source's best text, what it ran)"""
    engine = make(run, selected, decode)
    return ([h.text for h in engine.translate_best(eval_set, decode)], None,
            engine.settings(decode))
  return translate, run, stub


SOURCES = ["Ein Hund.", "Zwei junge Männer spielen im Sand am Strand mit einem roten Ball.",
           "Eine Frau."]


def test_ctranslate2_gives_each_sentence_our_length_cap(monkeypatch, tiny_tokenizer):
  """max_length_a/b honoured: each sentence translated with the cap our search gives it
  (min(max_length, a * source length + b), EOS included), a call per cap."""
  translate, run, stub = _engine(monkeypatch, tiny_tokenizer,
                                 lambda pieces, kw: [["▁a"] * kw["max_decoding_length"]])
  eval_set = EvalSet.from_pairs(SOURCES, [], run.tokenizer)
  translated, _, settings = translate(run, Selected("step_1", [1]), eval_set, run.cfg.decode)
  capped = {tuple(t): kw["max_decoding_length"] for tokens, _, kw in stub.calls for t in tokens}
  ours = [int(c) for c in sentence_caps(run.cfg.decode, np.stack([np.pad(ids, (0, 40 - len(ids)))
                                                                for ids in eval_set.source_ids]),
                                        None, run.cfg.model.max_len)]
  assert [capped[tuple(run.tokenizer.encode_pieces(s))] for s in SOURCES] == ours
  assert len(set(ours)) == 2 and len(stub.calls) == 2  # (the two short ones share a call)
  assert [len(t.split()) for t in translated] == ours
  assert settings["translate_batch"]["max_decoding_length"] == run.cfg.decode.max_length


def test_ctranslate2_chooses_among_its_candidates_by_mbr_as_ours_does(monkeypatch,
                                                                       tiny_tokenizer):
  """mbr honoured: CTranslate2 asked for mbr_candidates hypotheses, ordered by our
  `mbr_order` (the first one, with nbest 1, the translation)."""
  texts = ["Eine Katze schläft.", "Ein Hund rennt.", "Ein Hund läuft.", "Ein Hund läuft."]
  translate, run, stub = _engine(
      monkeypatch, tiny_tokenizer,
      lambda pieces, kw: [Tokenizer.load(tiny_tokenizer).encode_pieces(t) + ["</s>"]
                          for t in texts[:kw["num_hypotheses"]]],
      beam_size=4, mbr="chrf", mbr_candidates=4)
  decode = run.cfg.decode
  eval_set = EvalSet.from_pairs(SOURCES[:1], [], run.tokenizer)
  (translated,), _, _ = translate(run, Selected("step_1", [1]), eval_set, decode)
  candidates = [run.tokenizer.detokenize(run.tokenizer.piece_ids(run.tokenizer.encode_pieces(t)))
                for t in texts]
  assert translated == candidates[mbr_order(candidates, "chrf")[0]] != candidates[0]
  assert stub.calls[0][2]["num_hypotheses"] == 4


def test_ctranslate2_takes_the_repetition_options_and_says_its_length_penalty(
    monkeypatch, tiny_tokenizer, caplog):
  """What CTranslate2 runs is what results.json records (`settings`), and its length
  penalty's formula, not ours, is said once in a line."""
  translate, run, stub = _engine(monkeypatch, tiny_tokenizer, lambda pieces, kw: [["▁a"]],
                                 no_repeat_ngram_size=3, repetition_penalty=1.2)
  eval_set = EvalSet.from_pairs(SOURCES, [], run.tokenizer)
  with caplog.at_level(logging.WARNING):
    _, _, settings = translate(run, Selected("step_1", [1]), eval_set, run.cfg.decode)
  assert {k: stub.calls[0][2][k] for k in ("no_repeat_ngram_size", "repetition_penalty",
                                           "length_penalty")} == dict(
      no_repeat_ngram_size=3, repetition_penalty=1.2, length_penalty=0.6)
  assert settings["translate_batch"]["length_penalty"] == 0.6
  (note,) = settings["differences"]
  assert note.startswith("length_penalty=0.6: CTranslate2 divides a hypothesis' "
                         "log-probability by length ** 0.6, ours by ((5 + length) / 6) ** 0.6")
  assert [r.getMessage() for r in caplog.records] == [f"--engine=ctranslate2: {note}"]


def test_a_ctranslate2_translator_refuses_alignments_in_one_line(monkeypatch, tiny_tokenizer):
  _, run, _ = _engine(monkeypatch, tiny_tokenizer, lambda pieces, kw: [["▁a"]])
  engine = engines.ctranslate2_translator("run", run=run, requested_type="float32")
  with pytest.raises(UsageError, match=r"^alignments: not with the ctranslate2 engine "
                                       r"\(our search's, with --alignments\)$"):
    engine.alignments(["Ein Hund."], [Hypothesis("a", 0.0, (5,))])


def test_the_ctranslate2_engine_keeps_empty_lines_and_puts_the_tag_first(monkeypatch,
                                                                         tiny_tokenizer):
  """Sentences in as our search takes them: the pieces of the ids ours decodes (a tag's
  first, no EOS), an empty line answered with no hypothesis and not given to CTranslate2."""
  _, run, stub = _engine(monkeypatch, tiny_tokenizer, lambda pieces, kw: [pieces + ["</s>"]])
  tag = run.tokenizer.encode("Hund")[0]
  engine = engines.Ctranslate2Engine("export", run.tokenizer, run.cfg.decode,
                                     run.cfg.model.max_len, source_prefix=[tag])
  out = engine.translate(["Ein Hund.", "", "  ", "Eine Katze."])
  given = [t for tokens, _, _ in stub.calls for t in tokens]
  assert sorted(given) == sorted(run.tokenizer.pieces([tag]) + run.tokenizer.encode_pieces(s)
                                 for s in ("Ein Hund.", "Eine Katze."))
  assert [len(hyps) for hyps in out] == [1, 0, 0, 1]
  assert out[0][0].ids == (tag, *run.tokenizer.encode("Ein Hund.")[:-1])
