r"""Prepares a config's data once, ahead of training: its TFDS datasets, its tokenizer and the
training split as token ids (config.data.pretokenize).

  transformer-jax-prepare-data --config=configs/wmt_base.py --workdir=runs/wmt_base

Training does the same on first use; running it apart is for big corpora and many hosts:
prepare WMT into a shared `config.data.cache_dir` and train the tokenizer into the shared
workdir on one machine, then start every host's training with the same flags (they read,
nothing is written twice). Prints each split's size and the tokenizer's pieces. With
--beam_runner, local corpora are cleaned and written, and training splits tokenized, by
Apache Beam pipelines (the same files; see transformer_jax/data/apache_beam_prep.py), e.g.
on a cluster:
  transformer-jax-prepare-data --config=... --workdir=... --beam_runner=FlinkRunner \
      --beam_option=--flink_master=HOST:8081 --beam_option=--environment_type=LOOPBACK
"""

import time

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.config.parse import from_config_dict
from transformer_jax.data.apache_beam_prep import beam_tokenizer, beam_writer
from transformer_jax.workdir.preparation import prepare


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("workdir", None, "The run's workdir: the tokenizer goes to "
                      "<workdir>/spm.model (or config.data.tokenizer_path).", flag_values=fv,
                      required=True)
  flags.DEFINE_string("beam_runner", "", "Write local corpora with this Apache Beam runner "
                      "(DirectRunner, FlinkRunner, SparkRunner, DataflowRunner, ...); '' = in "
                      "this process.", flag_values=fv)
  flags.DEFINE_multi_string("beam_option", [], "A Beam pipeline option, e.g. "
                            "--beam_option=--direct_num_workers=2; repeatable.", flag_values=fv)


def prepare_data(args: runner.Args):
  start = time.perf_counter()
  writers = ((beam_writer(args.beam_runner, args.beam_option),
              beam_tokenizer(args.beam_runner, args.beam_option)) if args.beam_runner else ())
  sizes, tokenizer = prepare(from_config_dict(args.configs["config"]), args.workdir, *writers)
  for name, size in sizes.items():
    print(f"{name}: {size:,} pairs")
  print(f"tokenizer: {tokenizer.path} ({tokenizer.vocab_size:,} pieces); "
        f"prepared in {time.perf_counter() - start:.0f} s")


def main(argv=None):
  runner.main("prepare_data", __doc__, define_flags, prepare_data, argv,
              configs={"config": "Training config file (configs/*.py)"})


if __name__ == "__main__":
  main()
