"""A population's train step on a TPU, as the TPU compiler predicts it (no TPU needed): K
members (`config.population.seeds=K`, vmapped as `auto` picks on TPU) against a single run, by
the compile tool's method (aot/report.py: the compiler's estimate where it gives one, else the
roofline of its counts).

  python benchmarks/population_tpu.py --config=configs/default.py --target=v5e-1 \
      --sizes=1,2,4,8,16

Prints, per K: memory per chip, the predicted step and its method, member-steps/s and their
ratio to the single run's. Needs libtpu (pip install 'transformer_jax[tpu]').
"""

import dataclasses

from absl import app, flags
from ml_collections import config_flags

from transformer_jax.aot import check, targets
from transformer_jax.config.parse import from_config_dict

config_flags.DEFINE_config_file("config", "configs/default.py", "Training config.")
flags.DEFINE_string("target", "v5e-1", "TPU slice (transformer-jax-compile's names).")
flags.DEFINE_list("sizes", ["1", "2", "4", "8", "16"], "Population sizes K.")
FLAGS = flags.FLAGS


def main(_):
  base = from_config_dict(FLAGS.config)
  target = targets.target(FLAGS.target)
  print(f"{targets.describe(target)}; config {FLAGS.config.model.dtype} model, batch "
        f"{base.data.batch_size} rows x {base.data.max_target_length}")
  print("| run | memory per chip (GiB) | predicted step (ms) | method | member-steps/s | "
        "vs a single run |")
  print("|---|---|---|---|---|---|")
  single = None
  for k in [0, *map(int, FLAGS.sizes)]:
    cfg = dataclasses.replace(base, num_train_steps=max(base.num_train_steps, 1),  # (not planned)
                              population=dataclasses.replace(base.population, seeds=k))
    (r,) = check.check(cfg, target, ("train",))
    rate = max(k, 1) / r.seconds
    single = single or rate
    memory = r.memory.total / 2 ** 30 if r.memory else float("nan")
    print(f"| {f'K={k}' if k else 'single run'} | {memory:.2f} | {r.seconds * 1e3:.2f} | "
          f"{r.method} | {rate:,.0f} | {rate / single:.2f}x |", flush=True)


if __name__ == "__main__":
  app.run(main)
