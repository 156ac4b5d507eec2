"""A population's command: members' values as config.population tuples, shared values once;
a member's own command trains it alone in its population's batch order; a rerun population's
members whose trials are over are asked to stop."""

import optuna
from optuna.trial import TrialState, create_trial

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.config.search_space import choice, loguniform
from transformer_jax.configs import tiny
from transformer_jax.sweeps.trials import TRAIN, TrialRunner
from transformer_jax.workdir import layout


def test_a_population_command_and_its_members_commands(tmp_path):
  spec = sweep_spec.new_spec()
  spec.population, spec.num_trials = 2, 4
  spec.search_space = {"optimizer": {"learning_rate": loguniform(1e-4, 1e-2)},
                       "seed": choice(1, 2, 3), "model": {"pre_layer_norm": choice(True, False)}}
  spec.fixed = {"num_train_steps": 6}
  base = tiny.get_config()
  base.seed = 7
  spec = sweep_spec.load_spec(spec, base)
  runner = TrialRunner(None, None, spec, ["--config=configs/tiny.py"], base, tmp_path, "", 10)
  members = [{"optimizer.learning_rate": 1e-3, "seed": 1, "model.pre_layer_norm": False},
             {"optimizer.learning_rate": 3e-3, "seed": 3, "model.pre_layer_norm": False}]
  cmd = runner.population_command(members, tmp_path / "populations" / "0000")
  assert cmd[:len(TRAIN)] == TRAIN
  assert sorted(cmd[len(TRAIN):]) == sorted([
      "--config=configs/tiny.py", "--config.num_train_steps=6",
      "--config.model.pre_layer_norm=false", "--config.population.learning_rate=(0.001,0.003,)",
      "--config.population.seed=(1,3,)", f"--workdir={tmp_path / 'populations' / '0000'}"])
  # Member 1 alone: its own seed, the population's data order (the base config's seed).
  alone = runner.command(members[1], tmp_path / "alone")
  assert "--config.seed=3" in alone and alone[-2:] == ["--config.data_seed=7",
                                                        f"--workdir={tmp_path / 'alone'}"]


def test_a_rerun_population_stops_the_members_nobody_reports(tmp_path):
  """Members 0 (complete) and 1 (pruned) are over; 2 is this worker's rerun; 3's rerun waits
  for another worker: only 0 and 1 get a stop request."""
  recorded = str(tmp_path / "populations" / "0000")
  study = optuna.create_study()
  for i, state in enumerate([TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING,
                             TrialState.WAITING]):
    study.add_trial(create_trial(state=state, value=1.0 if i == 0 else None,
                                 user_attrs={"population": recorded, "members": [0, 1, 2, 3],
                                             "member": i}))
  runner = TrialRunner(study, None, None, [], tiny.get_config(), tmp_path, "", 10)
  runner._stop_finished_members(recorded, tmp_path / "new", [0, 1, 2, 3], claimed={2})
  assert [layout.stop_request(layout.member_dir(tmp_path / "new", i)) for i in range(4)] == [
      "trial 0's run is over", "trial 1's run is over", None, None]
