"""The sweep report from a study: what a failed trial's row says, and plots whose axes show
the swept values as they are."""

import optuna
import sacrebleu
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from tests import helpers
from transformer_jax.config import search_space as sweep_spec
from transformer_jax.config.search_space import choice, integer
from transformer_jax.configs import tiny
from transformer_jax.reporting import plots
from transformer_jax.sweeps import report
from transformer_jax.workdir import layout

SPACE = {"optimizer": {"learning_rate": choice(1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3),
                       "warmup_steps": integer(5, 50, step=5)}}


def _study(spec):
  study = optuna.create_study(direction=spec.direction)
  dists = {"optimizer.learning_rate": CategoricalDistribution((1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)),
           "optimizer.warmup_steps": IntDistribution(5, 50, step=5)}
  study.add_trial(create_trial(state=TrialState.COMPLETE, value=2.5, distributions=dists,
                               params={"optimizer.learning_rate": 3e-3,
                                       "optimizer.warmup_steps": 10},
                               intermediate_values={5: 3.0, 10: 2.5}))
  study.add_trial(create_trial(state=TrialState.FAIL, distributions=dists,
                               params={"optimizer.learning_rate": 0.1,
                                       "optimizer.warmup_steps": 5},
                               intermediate_values={5: 2.0}))  # (a worker that died)
  study.add_trial(create_trial(state=TrialState.PRUNED, distributions=dists,
                               params={"optimizer.learning_rate": 0.3,
                                       "optimizer.warmup_steps": 20},
                               intermediate_values={5: 4.0}, user_attrs={"retry_of": 1}))
  return study


def test_a_failed_trial_has_no_objective_and_says_why():
  spec = sweep_spec.load_spec(helpers.with_overrides(sweep_spec.new_spec(), {
      "search_space": SPACE, "num_trials": 6, "objective": "eval/loss"}), tiny.get_config())
  table = report.rows(_study(spec), spec)
  failed, pruned = table[1], table[2]
  assert failed["state"] == "failed" and failed["objective"] is None
  assert failed["error"] == "its worker stopped (no heartbeat: killed or lost); rerun as trial 2"
  assert pruned["objective"] == 4.0  # (a pruned trial: its last reported value)
  assert report.best(table, spec)["trial"] == 0


def test_the_plots_show_choices_as_labelled_slots_and_trials_as_whole_numbers(
    tmp_path, monkeypatch):
  spec = sweep_spec.load_spec(helpers.with_overrides(sweep_spec.new_spec(), {
      "search_space": SPACE, "num_trials": 6, "objective": "eval/loss"}), tiny.get_config())
  figures = []
  monkeypatch.setattr(plots, "save", lambda fig, path, **kw: figures.append(fig))
  report.write(_study(spec), spec, tmp_path, lambda params, workdir: ["train.py"])
  params_fig, trials_fig = figures
  rate = params_fig.axes[0]
  assert [t.get_text() for t in rate.get_xticklabels()] == [
      "0.001", "0.003", "0.01", "0.03", "0.1", "0.3"]
  assert list(rate.get_xticks()) == [0, 1, 2, 3, 4, 5] and rate.get_xscale() == "linear"
  assert all(float(t).is_integer() for t in params_fig.axes[1].get_xticks())
  assert all(float(t).is_integer() for t in trials_fig.axes[0].get_xticks())


def test_the_report_tests_each_trial_against_the_best_on_its_translations(tmp_path):
  """Trials' validation translations: one a word away from the best's (not significantly
  different), one far worse (significant); one trial's files are gone, another's cut short."""
  refs = [f"a man in a {c} shirt is walking his dog number {i} in the park"
          for i, c in enumerate(["red", "blue", "green", "white"] * 50)]
  systems = {0: refs, 1: [r.replace("park", "garden") if i < 3 else r for i, r in enumerate(refs)],
             2: [r.split(" in ")[0] for r in refs], 3: refs, 4: refs[:-1] + ["a dog"]}
  study = optuna.create_study(direction="maximize")
  rates = (1e-3, 3e-3, 1e-2, 3e-2, 0.1)
  dist = {"optimizer.learning_rate": CategoricalDistribution(rates)}
  for trial, hyps in systems.items():
    workdir = tmp_path / str(trial)
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    if trial != 3:
      layout.save_validation(workdir, 10, hyps, refs, type("Score", (), {
          "bleu": bleu.score, "chrf": 0.0})())
    if trial == 4:  # (its translations cut short after they were scored)
      (workdir / "validation" / "last.hyp").write_text("a dog\n")
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=bleu.score - (trial == 3),
                                 distributions=dist,
                                 params={"optimizer.learning_rate": rates[trial]},
                                 user_attrs={"workdir": str(workdir)}))
  spec = sweep_spec.load_spec(helpers.with_overrides(sweep_spec.new_spec(), {
      "search_space": {"optimizer": {"learning_rate": choice(*rates)}},
      "num_trials": 5}), tiny.get_config())
  p = report.p_vs_best(report.rows(study, spec), spec)
  assert set(p) == {1, 2}  # (0 is the best; 3's translations are gone, 4's cut short)
  assert p[1] > 0.05 and p[2] < 0.01
  text = report.write(study, spec, tmp_path, lambda params, workdir: ["train.py"])
  assert "not significantly different from the best: 1" in text
  assert "p_vs_best" in (tmp_path / "results.csv").read_text().splitlines()[0]
