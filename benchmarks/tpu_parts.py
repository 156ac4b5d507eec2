"""The compile tool's step-time prediction checked against the sum of its parts: a config's
train step compiled for a TPU slice whole, and as its two parts (the gradients; the optimizer
update with its finite-step guard), each loop-free, with the compiler's own estimates.

  python benchmarks/tpu_parts.py --config=configs/wmt_base.py --target=v5p-8

Prints, per program, the compiler's estimate (optimal_seconds), FLOPs and bytes accessed per
chip and the roofline max(FLOPs / peak, bytes / HBM bandwidth); then the whole step against the
sum of the parts. Needs libtpu (pip install 'transformer_jax[tpu]'); no TPU.
"""

import time

import jax
import jax.numpy as jnp
from absl import app, flags
from ml_collections import config_flags

from transformer_jax.aot import check, programs, report, targets
from transformer_jax.config.parse import from_config_dict
from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.platform import tracing_for
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training import step as step_lib
from transformer_jax.training.settled_config import make_mesh
from transformer_jax.training.state import abstract_state

config_flags.DEFINE_config_file("config", "configs/wmt_base.py", "Training config.")
flags.DEFINE_string("target", "v5p-8", "TPU slice (transformer-jax-compile's names).")
FLAGS = flags.FLAGS


def _parts(cfg, mesh):
  """(gradients program, update program), lowered with the run's shardings."""
  model = Transformer(cfg.model)
  state = abstract_state(cfg, model, mesh)
  shardings = jax.tree_util.tree_map(lambda x: x.sharding, state)
  rows = cfg.data.batch_size
  batch = {k: jax.ShapeDtypeStruct(
      (rows, cfg.data.max_target_length if k.startswith("targets")
       else cfg.data.max_source_length), jnp.int32, sharding=mesh_lib.batch_sharding(mesh))
      for k in programs.TRAIN_KEYS}
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=mesh_lib.replicated(mesh))

  def gradients(params, batch, rng):
    def loss(p):
      sums = step_lib.training_loss_sums(model, p, batch, {"dropout": rng}, cfg.label_smoothing,
                                         mesh)
      return sums[0] / jnp.maximum(sums[2], 1.0), sums
    return jax.grad(loss, has_aux=True)(params)

  def update(state, grads):  # (train_step's update and guard, on given gradients)
    finite = jnp.isfinite(jax.tree_util.tree_reduce(
        lambda a, g: a + jnp.sum(g.astype(jnp.float32)), grads, 0.0))
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    new = state.replace(step=state.step + 1, params=jax.tree_util.tree_map(
        jnp.add, state.params, updates), opt_state=opt_state)
    return jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, state)

  grads = jax.jit(gradients, out_shardings=(shardings.params, None)).lower(
      state.params, batch, rng)
  upd = jax.jit(update, donate_argnums=(0,), out_shardings=shardings).lower(
      state, jax.tree_util.tree_map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype,
                                                                      sharding=s),
                                    state.params, shardings.params))
  return grads, upd


def main(_):
  cfg = check.for_target(from_config_dict(FLAGS.config))
  target = targets.target(FLAGS.target)
  devices = targets.devices(target)
  mesh = make_mesh(cfg, devices)
  chip = target.chip
  whole = programs.train_program(cfg, mesh).lower
  with tracing_for(devices[0].platform):  # the TPU's loss tiles and attention, as `whole`'s
    gradients, update = _parts(cfg, mesh)
  seconds = {}
  with check.without_persistent_cache():
    for name, lowered in [("whole step", whole()), ("gradients", gradients),
                          ("update", update)]:
      start = time.perf_counter()
      compiled = lowered.compile()
      flops, bytes_, optimal = report.compiler_cost(compiled)
      roofline = max(flops / chip.peak_bf16_flops, bytes_ / chip.hbm_bytes_per_second)
      seconds[name] = (optimal, roofline)
      print(f"{name}: compiler {optimal * 1e3:.2f} ms, roofline {roofline * 1e3:.2f} ms, "
            f"{flops:.3g} FLOPs, {bytes_:.3g} bytes per chip "
            f"(compiled in {time.perf_counter() - start:.0f} s)", flush=True)
  for i, kind in enumerate(("compiler", "roofline")):
    parts = seconds["gradients"][i] + seconds["update"][i]
    print(f"{kind}: whole {seconds['whole step'][i] * 1e3:.2f} ms, parts "
          f"{parts * 1e3:.2f} ms ({seconds['whole step'][i] / parts:.3f}x)")


if __name__ == "__main__":
  app.run(main)
