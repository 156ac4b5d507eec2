r"""Serves a trained run over HTTP: LibreTranslate's API, ours with decoding options, metrics.

  transformer-jax-serve --workdir=runs/default [--checkpoint=best] [--port=5000]
  curl -s localhost:5000/translate -H 'Content-Type: application/json' \
      -d '{"q": "Ein Hund läuft im Schnee.", "source": "de", "target": "en"}'

Our engine decodes in flight: a request's sentences go into the next free of
--max_batch_sentences slots as it arrives, beside the sentences already decoding, and it is
answered when its last one is done (no batch is waited for). CTranslate2's engine calls are
batched instead (up to --max_batch_sentences; a batch waits up to --max_wait_ms for the
clients the last one answered), --workers batches at once. Every program is made before the
port opens; SIGTERM stops accepting, answers what was accepted and exits 0. The page at `/`
translates in a browser. Endpoints: transformer_jax/serving/api.py.
"""

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.serving import server


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_multi_string("workdir", None, "A training workdir; several: an ensemble.",
                            flag_values=fv, required=True)
  flags.DEFINE_string("checkpoint", "latest", "As translate's.", flag_values=fv)
  runner.define_engine_flags(fv)
  runner.define_decoding_flags(fv)
  flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.", flag_values=fv)
  flags.DEFINE_integer("port", 5000, "Port (0: any free one, printed).", flag_values=fv)
  flags.DEFINE_integer("max_batch_sentences", 0, "Sentences decoded at once: our engine's "
                       "slots; CTranslate2's most per engine call. 0: 16 slots for our engine "
                       "on a CPU, 32 otherwise.", lower_bound=0, flag_values=fv)
  flags.DEFINE_float("max_wait_ms", 50.0, "CTranslate2: longest a batch waits for more "
                     "requests (from its first, or from the last answer: for its clients to "
                     "send again).", flag_values=fv)
  flags.DEFINE_integer("workers", 0, "CTranslate2: batches translated at once, each a share "
                       "of the requests held; 0: two on a CPU (they use its cores better than "
                       "one batch of both), one on an accelerator.", lower_bound=0,
                       flag_values=fv)
  flags.DEFINE_integer("max_queue", 1024, "Most sentences waiting (then 503).", flag_values=fv)
  flags.DEFINE_integer("max_request_sentences", 256, "Most sentences per request (413).",
                       flag_values=fv)
  flags.DEFINE_integer("max_body_bytes", 1 << 20, "Largest request body (413).", flag_values=fv)
  flags.DEFINE_float("timeout_s", 60.0, "A request's deadline, queueing included (504).",
                     flag_values=fv)
  flags.DEFINE_integer("warm_up_batches", 3, "0: before the port opens, only what two short "
                       "lines need; else our engine's every program, CTranslate2's validation "
                       "batches of this many at a few batch sizes.", flag_values=fv)


def serve(args: runner.Args):
  server.serve(args)


def main(argv=None):
  runner.main("serve", __doc__, define_flags, serve, argv)


if __name__ == "__main__":
  main()
