"""The translate tool: one output line per input line, n-best lists, bad input named."""

import gzip

import pytest

from tests import helpers
from transformer_jax.cli import translate as translate_cli


def _translate(workdir, stdin: bytes, *args):
  return helpers.run_tool(translate_cli.main, f"--workdir={workdir}", "--interactive=false",
                          *args, stdin=stdin)


def test_translate_keeps_line_alignment(tiny_run):
  lines = ["Ein Hund läuft.", "", "Zwei Männer " * 150, "?!...", "", "这是一个测试",
           "مرحبا بالعالم", "Eine Frau."]
  status, out, err = _translate(tiny_run, ("\n".join(lines) + "\n").encode())
  assert status == 0, err[-2000:]
  out = out.split("\n")
  assert out[-1] == ""
  out = out[:-1]
  assert len(out) == len(lines)
  for src, hyp in zip(lines, out):
    assert (hyp == "") == (src == "")
  assert "inputs longer than 256 subwords are truncated" in err


@pytest.mark.parametrize("interactive", ["false", "true"])
def test_translate_nbest_output(tiny_run, interactive):
  status, out, err = helpers.run_tool(translate_cli.main, f"--workdir={tiny_run}",
                                      f"--interactive={interactive}", "--decode=nbest=2",
                                      stdin=b"Ein Hund.\n\nEine Katze.\n")
  assert status == 0, err[-2000:]
  # (interactively, a line says when the first sentence can be typed)
  assert ("ready: one sentence per line (Ctrl-D ends)" in err) == (interactive == "true")
  rows = [x.split(" ||| ") for x in out.splitlines()]
  assert {int(x[0]) for x in rows} == {0, 1, 2}
  # (the empty line's: as many lines as every other's, so that a reader may count them)
  assert [x for x in rows if int(x[0]) == 1] == [["1", "", "0.0000"]] * 2
  for index in (0, 2):
    scores = [float(x[2]) for x in rows if int(x[0]) == index]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)


def test_translate_files_and_bad_input_are_named(tiny_run, tmp_path):
  (tmp_path / "in.de").write_text("Ein Hund.\nEine Katze.\n", encoding="utf-8")
  status, _, _ = _translate(tiny_run, b"", f"--input={tmp_path / 'in.de'}",
                            f"--output={tmp_path / 'out.en'}")
  assert status == 0 and len((tmp_path / "out.en").read_text().splitlines()) == 2
  (tmp_path / "in.de.gz").write_bytes(gzip.compress("Ein Hund.\n\nEine Katze.\n".encode()))
  status, _, _ = _translate(tiny_run, b"", f"--input={tmp_path / 'in.de.gz'}",
                            f"--output={tmp_path / 'gz.en'}")  # (gzipped, as evaluate takes)
  assert status == 0 and len((tmp_path / "gz.en").read_text().splitlines()) == 3
  status, _, err = _translate(tiny_run, b"gut\nauch gut\nkaputt \xff\n")
  assert status == 1
  assert helpers.one_line_error(err).startswith("translate: <stdin>:3: not valid UTF-8")
  # (an --output that exists is replaced whole or not at all: a failed run leaves it as it was)
  status, _, _ = _translate(tiny_run, b"gut\nkaputt \xff\n", f"--output={tmp_path / 'out.en'}")
  assert status == 1 and len((tmp_path / "out.en").read_text().splitlines()) == 2
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
  status, _, err = _translate(tiny_run, b"", f"--input={tmp_path / 'nowhere.de'}")
  assert status == 1 and "nowhere.de does not exist" in helpers.one_line_error(err)
  status, _, err = _translate(tiny_run, b"x\n", "--decode=beam=3")
  assert status == 2 and "unknown key 'beam' (did you mean beam_size or beam_impl?)" in err


def test_prefixes_and_an_ensemble_of_two_copies(tiny_run, tmp_path):
  text = b"Ein Hund.\n\nEine Katze spielt.\n"
  prefixes = tmp_path / "prefixes.en"
  prefixes.write_text("a small\n\n\n")
  status, out, err = _translate(tiny_run, text, f"--prefix_file={prefixes}")
  assert status == 0, err[-2000:]
  with_prefix = out.split("\n")[:3]
  assert with_prefix[0].startswith("a small") and with_prefix[1] == ""
  _, plain, _ = _translate(tiny_run, text)
  assert with_prefix[2] == plain.split("\n")[2]  # (no prefix on that line: as without)
  # Two copies of one run decode as that run does.
  status, twice, err = _translate(tiny_run, text, f"--workdir={tiny_run}")
  assert status == 0, err[-2000:]
  assert twice == plain
  prefixes.write_text("a\nb\n")  # (one line short)
  status, _, err = _translate(tiny_run, text, f"--prefix_file={prefixes}")
  assert status != 0 and helpers.one_line_error(err) == (
      "translate: --prefix_file has 2 lines, the input 3: one prefix line per input line "
      "(empty for none)")


@pytest.mark.parametrize("nbest", [1, 2])
def test_translate_alignments_link_each_target_word_to_a_source_word(tiny_run, nbest):
  sources = ["Ein Hund läuft durch den Schnee.", "", "Zwei Männer spielen Fußball."]
  status, out, err = _translate(tiny_run, ("\n".join(sources) + "\n").encode(), "--alignments",
                                f"--decode=nbest={nbest}")
  assert status == 0, err[-2000:]
  rows = [line.split(" ||| ") for line in out.splitlines()]
  if nbest == 1:
    rows = [[str(i), text, "0", links] for i, (text, links) in enumerate(rows)]
  assert len(rows) == 3 * nbest
  for index, text, _, links in rows:
    pairs = [tuple(map(int, p.split("-"))) for p in links.split()]
    # (each target word once, in order, to a word of its source)
    assert [j for _, j in pairs] == list(range(len(text.split())))
    assert all(0 <= i < len(sources[int(index)].split()) for i, _ in pairs)
    assert bool(pairs) == bool(sources[int(index)]) == bool(text)
  status, _, err = _translate(tiny_run, b"Ein Hund.\n", "--alignments", "--alignment_layer=2")
  assert status != 0 and "--alignment_layer=2: the decoder has layers 0 to 1" in \
      helpers.one_line_error(err)
