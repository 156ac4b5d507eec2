r"""The search that picks the default recipe: the choices that matter within the demo's time on
2 CPU cores, each trial the default config trained for a fixed wall-clock budget, scored by
its last validation BLEU (val, 1,014 sentences; the test set is not decoded).

  transformer-jax-sweep --config=configs/default.py \
      --sweep=configs/sweeps/recipe_tpe.py --workdir=runs/sweep_recipe

Depth is swept at equal time (a deeper model takes fewer steps in the budget). The first six
trials are start points: the recipe to beat (configs/multi30k_modern.py's choices: rotary
positions, RMSNorm, EMA) and one change at a time around it (subword sampling at alpha 0.3 and
0.5, dropout 0.2, learning rate 3e-3, a 4-layer encoder); the last two TPE picks (at random:
TPE samples its first 10 trials so). `--sweep.fixed.time_budget_minutes=14` gives each trial
the demo's budget; the shipped 6 minutes is a time-scaled search (BENCHMARKS.md, "The default
recipe").
"""

from transformer_jax.config.search_space import choice, loguniform, new_spec, uniform


MODERN = {"model": {"positional_encoding": "rotary", "norm": "rmsnorm", "dropout_rate": 0.1,
                    "num_encoder_layers": 3, "num_decoder_layers": 3},
          "optimizer": {"learning_rate": 2e-3, "warmup_steps": 100, "ema_decay": 0.999},
          "label_smoothing": 0.1, "data": {"subword_sampling": {"alpha": 0.0}}}


def _variant(change: dict, base: dict = MODERN) -> dict:
  """`base` with the values of `change` (nested like it) in their place."""
  return {key: _variant(change[key], value) if isinstance(value, dict) and key in change
          else change.get(key, value) for key, value in base.items()}


def get_config():
  sweep = new_spec()
  sweep.search_space = {
      "model": {"positional_encoding": choice("sinusoidal", "rotary"),
                "norm": choice("layernorm", "rmsnorm"),
                "dropout_rate": uniform(0.05, 0.3),
                "num_encoder_layers": choice(3, 4, 6),
                "num_decoder_layers": choice(2, 3)},
      "optimizer": {"learning_rate": loguniform(1e-3, 4e-3),
                    "warmup_steps": choice(50, 100, 200),
                    "ema_decay": choice(0.0, 0.999, 0.9995)},
      "label_smoothing": uniform(0.05, 0.2),
      # (over the whole lattice; 0.1 doubles Multi30k's pieces per sentence, 0.3 adds ~15%)
      "data": {"subword_sampling": {"alpha": choice(0.0, 0.3, 0.5)}},
  }
  sweep.fixed = {"time_budget_minutes": 6.0,  # every trial ends on the clock, in its cooldown
                 "num_train_steps": 5000, "eval_every_steps": 250, "data": {"test_split": ""}}
  # The recipe to beat, and one change at a time around it; then the sampler's own picks.
  sweep.start_points = (MODERN,
                        _variant({"data": {"subword_sampling": {"alpha": 0.3}}}),
                        _variant({"data": {"subword_sampling": {"alpha": 0.5}}}),
                        _variant({"model": {"dropout_rate": 0.2}}),
                        _variant({"optimizer": {"learning_rate": 3e-3}}),
                        _variant({"model": {"num_encoder_layers": 4}}))
  sweep.objective = "eval/bleu"
  sweep.sampler = "tpe"
  sweep.num_trials = 8
  sweep.pruner = "median"
  sweep.pruner_startup_trials = 3
  sweep.pruner_warmup_steps = 250
  return sweep
