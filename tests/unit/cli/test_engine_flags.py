"""A flag the chosen engine does not take, or an option it cannot honour, is one line in every
tool that decodes, before anything is loaded (the workdir here does not exist)."""

import pytest

from tests import helpers
from transformer_jax.cli import evaluate, serve, translate, translate_corpus

DTYPE = "--dtype: not with --engine=ctranslate2 (use --compute_type; alignments come from our "\
        "search)"
COMPUTE_TYPE = "--compute_type is CTranslate2's: with --engine=ctranslate2 (our search takes "\
               "--dtype)"


def _tools(tmp_path):
  """Each decoding tool's command line before its engine's flags."""
  workdir = f"--workdir={tmp_path / 'no_run'}"
  return {"evaluate": (evaluate.main, [workdir, f"--output_dir={tmp_path / 'eval'}"]),
          "translate": (translate.main, [workdir, "--interactive=false"]),
          "translate-corpus": (translate_corpus.main, [workdir, f"--input={tmp_path / 'in'}",
                                                       f"--out={tmp_path / 'out'}"]),
          "serve": (serve.main, [workdir, "--port=0"])}


@pytest.mark.parametrize("tool", ["evaluate", "translate", "translate-corpus", "serve"])
@pytest.mark.parametrize("flags, error", [
    (["--engine=ctranslate2", "--dtype=float32"], DTYPE),
    (["--engine=jax", "--compute_type=int8"], COMPUTE_TYPE)])
def test_a_flag_the_engine_does_not_take_is_refused(tmp_path, tool, flags, error):
  main, args = _tools(tmp_path)[tool]
  status, _, err = helpers.run_tool(main, *args, *flags)
  assert status == 2
  assert helpers.one_line_error(err) == f"{tool}: {error} (--help lists the flags)"


@pytest.mark.parametrize("flags, error", [
    (["--alignments"], "--engine=ctranslate2: no --alignments (our search's)"),
    (["--workdir=other"], "--engine=ctranslate2: one --workdir (no ensembles)")])
def test_evaluate_with_ctranslate2_refuses_alignments_and_ensembles(tmp_path, flags, error):
  main, args = _tools(tmp_path)["evaluate"]
  status, _, err = helpers.run_tool(main, *args, "--engine=ctranslate2", *flags)
  assert status == 2
  assert helpers.one_line_error(err) == f"evaluate: {error} (--help lists the flags)"
