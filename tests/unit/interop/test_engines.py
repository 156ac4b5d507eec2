"""The CTranslate2 engine's export cache: a checkpoint is exported once per version of the code
that exports it (the package's source, as the program store keys its programs)."""

from types import SimpleNamespace

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
