"""The compile report's words: the compiler's out-of-memory account in one line, and the
levers a refusal offers."""

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
