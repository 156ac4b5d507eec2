"""The compile report's words: the compiler's out-of-memory account in one line, the levers
a refusal offers, and where the traffic and the compiler's time go by block."""

import dataclasses

from tests.helpers import tiny_train_config
from transformer_jax.aot import check, report


def test_the_compilers_out_of_memory_account_is_kept_whole_on_one_line():
  error = RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory "
                       "in memory space hbm. Used 20.51G of 15.75G hbm. Exceeded hbm capacity "
                       "by 4.76G.\n\nTotal hbm usage >= 20.76G:\n    reserved 258.00M")
  assert report.out_of_memory(error) == "used 20.51G of 15.75G HBM, 4.76G over"
  other = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
                       "required for HLO temporaries (24.69G)\nexceeds available HBM (15.75G).")
  assert report.out_of_memory(other) == (
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (24.69G) exceeds available HBM (15.75G).")
  assert report.out_of_memory(RuntimeError("INVALID_ARGUMENT: bad shape")) is None


def test_a_refusal_offers_only_the_levers_not_yet_pulled_and_that_divide():
  train = check.levers(tiny_train_config(**{"data.batch_size": 12}), "train_step")
  assert "--config.num_micro_batches=2 " in train and "remat=full" in train and "(1,-1,1)" in train
  pulled = check.levers(tiny_train_config(**{"data.batch_size": 12, "num_micro_batches": 4,
                                              "model.remat": "full",
                                              "parallelism.mesh_shape": (1, -1, 1)}),
                        "train_step")
  assert pulled == "try --config.num_micro_batches=12 (the batch in 12 pieces)"
  decoding = check.levers(tiny_train_config(), "beam_advance")
  assert "--config.decode.batch_size" in decoding and "num_micro_batches" not in decoding


def test_the_report_shows_the_compilers_time_by_block_where_it_gives_one():
  made = report.Report(
      "train_step", "v5e-4", 4, "step", True, report.Memory(2**30, 0, 2**30, 2**20), 16 * 2**30,
      "", 0.01, "compiler", 1e12, 1e10, 0.01, 4e12, 0.1, 1e6, {}, [],
      {"attention": 3 * 2**30, "feed-forward": 2**30}, {"attention": 300, "feed-forward": 100},
      0.0, 1.0)
  shown = "\n".join(report.lines(made))
  assert "HBM traffic per step: attention 75%, feed-forward 25% of 4.00 GiB" in shown
  assert "the compiler's time per step: attention 75%, feed-forward 25% of 400 cycles" in shown
  gpu = "\n".join(report.lines(dataclasses.replace(made, cycles={})))
  assert "the compiler's time" not in gpu  # (none recorded: the CUDA compiler's)
