"""The server's life: the engine loaded and warmed up before the port opens, uvicorn serving
the endpoints, and on SIGTERM (or Ctrl-C) no new connections, every accepted request
answered, the batcher drained; exit 0 after SIGTERM (130 after Ctrl-C, as every tool)."""

from __future__ import annotations

import logging
import signal
import socket
import time

import jax
import uvicorn

from transformer_jax.errors import UsageError
from transformer_jax.interop import engines
from transformer_jax.serving.api import Limits, make_app
from transformer_jax.serving.batcher import Batcher
from transformer_jax.serving.engine import Engine
from transformer_jax.serving.metrics import Metrics

log = logging.getLogger(__name__)


def serve(args):
  """Runs the server of the `transformer-jax-serve` flags until SIGTERM or Ctrl-C."""
  sock = _bound(args.host, args.port)  # (a port in use said now, not after the warm-up)
  workers = args.workers or (2 if args.engine == "ctranslate2" or jax.default_backend() == "cpu"
                             else 1)
  # (batches of at most the server's size; our search aligns on request)
  engine = Engine(engines.translator(
      args.engine, args.workdir, args.checkpoint, [f"batch_size={args.max_batch_sentences}"],
      args.source_tag, args.dtype, args.compute_type, alignments=args.engine == "jax",
      calls_at_once=workers))
  start = time.monotonic()
  log.info("Warming up (%s -> %s): compiling the programs requests will need",
           engine.source_lang, engine.target_lang)
  sentences = engine.warm_up(args.warm_up_batches)
  log.info("Warmed up on %d sentences in %.1f s", sentences, time.monotonic() - start)
  metrics = Metrics()
  batcher = Batcher(engine, metrics, args.max_batch_sentences, args.max_wait_ms / 1000,
                    args.max_queue, workers)
  app = make_app(engine, batcher, metrics, Limits(args.max_body_bytes,
                                                  args.max_request_sentences,
                                                  timeout_s=args.timeout_s))
  sock.listen(2048)  # (from now on connections wait for uvicorn's accept: none is refused)
  log.info("Serving on http://%s:%d (engine %s, %d worker%s)", args.host,
           sock.getsockname()[1], engine.name, workers, "s" if workers > 1 else "")
  # (httptools: the parser in C; h11's pure Python took a core's tenth at 200 requests/s)
  server = uvicorn.Server(uvicorn.Config(app, http="httptools", log_level="warning",
                                         access_log=False))
  # (uvicorn handles SIGTERM: stop accepting, finish what is in flight; then it raises the
  # signal again for the handler it found: this one, so that the drained server exits 0)
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
  try:
    server.run(sockets=[sock])
  finally:
    batcher.close()
    signal.signal(signal.SIGTERM, previous)
  log.info("Stopped: every accepted request answered")


def _bound(host: str, port: int) -> socket.socket:
  """A socket bound to host:port, not yet listening (connections are refused until then)."""
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    raise UsageError(f"--host={host} --port={port}: cannot listen there ({e.strerror})"
                     ) from None
  return sock
