"""Translating a file into a parallel folder (back-translation, distillation): line alignment
whatever the lines, the record, resuming, and refusing to mix settings."""

import json
import os
import signal
from types import SimpleNamespace

import pytest

from tests import helpers
from transformer_jax.data import corpus
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import Interrupted, UsageError
from transformer_jax.inference.corpus_translation import (
  Counts,
  _usable,
  auto_block_lines,
  translate_corpus,
)
from transformer_jax.inference.translator import Translator

LINES = [b"Ein Hund rennt.", b"", b"Zwei M\xc3\xa4nner spielen Fu\xc3\x9fball.", b"\xff\xfe kaputt",
         b"   ", (b"sehr " * 300).strip(), b"Eine Frau liest."]


def _input(tmp_path, lines=LINES):
  path = tmp_path / "mono.de"
  path.write_bytes(b"".join(line + b"\n" for line in lines))
  return path


def test_every_input_line_gives_one_pair_and_the_record_says_what_made_it(tiny_run, tmp_path):
  translator = Translator(str(tiny_run), "latest")
  record = translate_corpus(translator, [str(tiny_run)], "latest", str(_input(tmp_path)),
                            str(tmp_path / "out"), tag="<BT>", block_lines=3)
  src = (tmp_path / "out" / "train.de").read_text().split("\n")[:-1]
  tgt = (tmp_path / "out" / "train.en").read_text().split("\n")[:-1]
  assert len(src) == len(tgt) == len(LINES)
  # the usable lines as given (stripped), the others empty on both sides: training drops them
  assert src == ["Ein Hund rennt.", "", "Zwei Männer spielen Fußball.", "", "", "",
                 "Eine Frau liest."]
  assert [bool(t) for t in tgt] == [bool(s) for s in src]
  assert record["counts"] == {"lines": 7, "empty": 2, "invalid": 1, "too_long": 1}
  assert record["tag"] == "<BT>" and record["checkpoint_labels"] == ["step_20"]
  assert record["checkpoint_steps"] == [[20]] and record["languages"] == ["de", "en"]
  assert record["decode"]["beam_size"] == translator.decode.beam_size
  assert json.loads((tmp_path / "out" / "translation.json").read_text()) == record
  # the folder is a corpus: its non-empty pairs read back through the corpus reader
  pairs = [(a, b) for _, a, b in corpus.read_parallel(tmp_path / "out", "train", ("de", "en"))]
  assert [a for a, _ in pairs] == src


def test_a_rerun_after_a_crash_mid_block_ends_with_the_uninterrupted_files(tiny_run, tmp_path,
                                                                          monkeypatch):
  lines = [f"Ein Hund Nummer {i} rennt.".encode() for i in range(10)]
  decode = ["sampling=true", "top_k=5"]  # (sampling: each block's seed must not depend on
  translator = Translator(str(tiny_run), "latest", decode)  # where a run started)
  args = ([str(tiny_run)], "latest", str(_input(tmp_path, lines)))
  translate_corpus(translator, *args, str(tmp_path / "whole"), block_lines=3)

  calls, real = [], translator.translate

  def crash_on_third_block(texts, **kwargs):
    calls.append(len(texts))
    if len(calls) == 3:  # (the files hold a partial block's bytes past the last record)
      with open(tmp_path / "cut" / ".train.en.partial", "a") as f:
        f.write("half a block\n")
      raise KeyboardInterrupt
    return real(texts, **kwargs)

  monkeypatch.setattr(translator, "translate", crash_on_third_block)
  with pytest.raises(Interrupted, match=r"^interrupted: 6 of 10 lines translated and saved in "
                                        r".*cut; rerun the same command to go on$"):
    translate_corpus(translator, *args, str(tmp_path / "cut"), block_lines=3)
  progress = json.loads((tmp_path / "cut" / "progress.json").read_text())
  assert progress["lines_done"] == 6
  assert not (tmp_path / "cut" / "train.en").exists()  # (not a corpus before it is complete)
  monkeypatch.setattr(translator, "translate", real)
  translate_corpus(translator, *args, str(tmp_path / "cut"))  # (the block size it began with)
  for name in ("train.de", "train.en", "translation.json"):
    whole = (tmp_path / "whole" / name).read_bytes()
    assert (tmp_path / "cut" / name).read_bytes() == whole.replace(b"/whole", b"/cut"), name
  assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [
      "progress.json", "train.de", "train.en", "translation.json"]
  # a finished folder: the same command again leaves it as it is
  before = (tmp_path / "cut" / "train.en").stat().st_mtime_ns
  translate_corpus(translator, *args, str(tmp_path / "cut"), block_lines=3)
  assert (tmp_path / "cut" / "train.en").stat().st_mtime_ns == before


def test_a_rerun_with_other_settings_is_refused_naming_them(tiny_run, tmp_path):
  args = ([str(tiny_run)], "latest", str(_input(tmp_path)), str(tmp_path / "out"))
  translate_corpus(Translator(str(tiny_run), "latest"), *args, block_lines=4)
  # (a folder from before a decoding key existed has the same settings: its value for older
  # runs is taken)
  record = tmp_path / "out" / "translation.json"
  older = json.loads(record.read_text())
  del older["decode"]["beam_impl"]
  record.write_text(json.dumps(older))
  translate_corpus(Translator(str(tiny_run), "latest"), *args, block_lines=4)
  with pytest.raises(UsageError, match=r"other decode, block_lines"):
    translate_corpus(Translator(str(tiny_run), "latest", ["beam_size=1"]), *args, block_lines=2)
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "train.en").write_text("not ours\n")
  with pytest.raises(UsageError, match="not written by this tool"):
    translate_corpus(Translator(str(tiny_run), "latest"), *args[:3], str(foreign))


def test_the_tool_runs_as_a_command_and_a_missing_input_is_one_line(tiny_run, tmp_path):
  from transformer_jax.cli import translate_corpus as cli
  status, out, err = helpers.run_tool(cli.main, f"--workdir={tiny_run}",
                                      f"--input={_input(tmp_path)}", f"--out={tmp_path / 'o'}")
  assert status == 0 and len((tmp_path / "o" / "train.en").read_text().splitlines()) == 7
  status, _, err = helpers.run_tool(cli.main, f"--workdir={tiny_run}",
                                    f"--input={tmp_path / 'absent.en'}", f"--out={tmp_path / 'p'}")
  assert status == 1 and helpers.one_line_error(err).endswith("absent.en does not exist")


def test_sigterm_stops_the_tool_in_one_line_saying_what_is_saved(tiny_run, tmp_path,
                                                                 monkeypatch):
  from transformer_jax.cli import translate_corpus as cli
  real = Translator.translate

  def sigterm_in_second_block(self, texts, **kwargs):
    if (tmp_path / "o" / "progress.json").is_file():
      os.kill(os.getpid(), signal.SIGTERM)
    return real(self, texts, **kwargs)

  monkeypatch.setattr(Translator, "translate", sigterm_in_second_block)
  before = signal.getsignal(signal.SIGTERM)
  status, _, err = helpers.run_tool(cli.main, f"--workdir={tiny_run}", "--block_lines=4",
                                    f"--input={_input(tmp_path)}", f"--out={tmp_path / 'o'}")
  assert status == 130 and signal.getsignal(signal.SIGTERM) is before
  assert helpers.one_line_error(err) == (
      f"translate-corpus: stopped by SIGTERM: 4 of 7 lines translated and saved in "
      f"{tmp_path / 'o'}; rerun the same command to go on")


def test_the_block_size_by_default_lets_every_input_resume_from_its_middle():
  assert [auto_block_lines(n) for n in (0, 7, 2000, 20_000, 10**7)] == [64, 64, 128, 1024, 2048]


def test_distillation_by_an_ensemble_records_its_members_and_matches_one_copy(tiny_run, tmp_path):
  # An ensemble of a run with itself averages equal log-probabilities: the translations of
  # the one model, written by the same tool (the teacher's source side in, a distilled
  # folder out).
  source = _input(tmp_path, [b"Ein Hund rennt.", b"Zwei Frauen lesen.", b"Ein Kind spielt."])
  one = translate_corpus(Translator(str(tiny_run), "latest"), [str(tiny_run)], "latest",
                         str(source), str(tmp_path / "one"), tag="")
  two = translate_corpus(Translator([str(tiny_run)] * 2, "latest"), [str(tiny_run)] * 2,
                         "latest", str(source), str(tmp_path / "two"), tag="")
  assert two["workdirs"] == [str(tiny_run)] * 2 and two["checkpoint_steps"] == [[20], [20]]
  assert (tmp_path / "two" / "train.en").read_text() == (tmp_path / "one" / "train.en").read_text()
  assert one["tag"] == two["tag"] == ""


def test_a_line_that_fits_only_without_the_tag_is_too_long_with_it(tiny_tokenizer):
  """(Counted against what every member of an ensemble reads: the first run's config may
  say more.)"""
  tokenizer = Tokenizer.load(tiny_tokenizer)
  text = "Ein Hund rennt durch den Schnee."
  fits = len(tokenizer.encode(text))  # (its pieces and EOS)
  model = SimpleNamespace(tokenizer=tokenizer,
                          cfg=SimpleNamespace(model=SimpleNamespace(max_len=fits + 10)))
  for prefix, expected in (([], text), ([5], "")):
    counts = Counts()
    assert _usable(text.encode(), SimpleNamespace(run=model, source_prefix=prefix,
                                                  max_len=fits), counts) == expected
    assert counts.too_long == (expected == "")
