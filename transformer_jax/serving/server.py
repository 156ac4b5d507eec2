"""The server's life: the engine loaded and warmed up before the port opens, uvicorn serving
the endpoints, and on SIGTERM (or Ctrl-C) no new connections, every accepted request
answered, the batcher drained; exit 0 after SIGTERM (130 after Ctrl-C, as every tool)."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import time

import jax
import uvicorn

from transformer_jax.errors import UsageError
from transformer_jax.interop import engines
from transformer_jax.parallel import compilation
from transformer_jax.serving.api import Limits, make_app
from transformer_jax.serving.batcher import Batcher
from transformer_jax.serving.inflight import InFlight
from transformer_jax.serving.metrics import Metrics
from transformer_jax.serving.service import Service

log = logging.getLogger(__name__)

# Our engine's slots on a CPU when --max_batch_sentences is 0 (auto): a step costs in
# proportion to the slots, filled or not, and closed-loop clients keep fewer sentences in
# flight than there are of them; 16 slots served 32 clients faster than 32 slots, and a lone
# request sooner (BENCHMARKS.md, "Serving: the server under load"). Elsewhere, and
# CTranslate2's calls: 32.
CPU_SERVER_SLOTS = 16
SERVER_SENTENCES = 32


def sentences_at_once(max_batch_sentences: int, engine: str) -> int:
  """The server's sentences decoded at once: the flag's, or (0) its auto."""
  if max_batch_sentences:
    return max_batch_sentences
  return (CPU_SERVER_SLOTS if engine == "jax" and jax.default_backend() == "cpu"
          else SERVER_SENTENCES)


def serve(args):
  """Runs the server of the `transformer-jax-serve` flags until SIGTERM or Ctrl-C."""
  if args.timeout_s <= 0 or args.max_wait_ms < 0:
    raise UsageError(f"--timeout_s={args.timeout_s:g} must be > 0 and --max_wait_ms="
                     f"{args.max_wait_ms:g} >= 0")
  if args.max_request_sentences > args.max_queue:
    raise UsageError(f"--max_request_sentences={args.max_request_sentences} is more than "
                     f"--max_queue={args.max_queue}: a request that large could never be "
                     "queued (every one would be answered 503)")
  # (a port in use, or one another server is warming up on, said now, not after the warm-up)
  sock, claim = _bound(args.host, args.port)
  workers = args.workers or (2 if args.engine == "ctranslate2" or jax.default_backend() == "cpu"
                             else 1)
  at_once = sentences_at_once(args.max_batch_sentences, args.engine)
  # (batches of at most the server's size, our engine's slots as many: the run's own
  # `decode.slots` and the CPU's cap on a set's slots do not apply; our search aligns on
  # request)
  service = Service(engines.translator(
      args.engine, args.workdir, args.checkpoint, [f"batch_size={at_once}", f"slots={at_once}"],
      args.source_tag, args.dtype, args.compute_type, alignments=args.engine == "jax",
      calls_at_once=workers))
  start = time.monotonic()
  log.info("Warming up (%s -> %s): compiling the programs requests will need",
           service.source_lang, service.target_lang)
  done = service.warm_up(args.warm_up_batches)
  log.info("Warmed up in %.1f s (%d %s)", time.monotonic() - start, done,
           "width classes' programs" if args.engine == "jax" else "sentences")
  metrics = Metrics(compilation.programs_prepared)  # (from now on: programs made under load)
  if args.engine == "jax":  # (sentences into the in-flight slots as they come)
    batcher = InFlight(service, metrics, args.max_queue)
  else:
    batcher = Batcher(service, metrics, at_once, args.max_wait_ms / 1000,
                      args.max_queue, workers)
  app = make_app(service, batcher, metrics, Limits(args.max_body_bytes,
                                                  args.max_request_sentences,
                                                  timeout_s=args.timeout_s))
  try:  # (from now on connections wait for uvicorn's accept: none is refused)
    sock.listen(2048)
  except OSError as e:  # (a program other than ours took the port meanwhile)
    raise UsageError(f"--host={args.host} --port={args.port}: cannot listen there "
                     f"({e.strerror})") from None
  log.info("Serving on http://%s:%d (engine %s, %s)", args.host, sock.getsockname()[1],
           service.name, f"{at_once} sentences in flight"
           if args.engine == "jax" else f"{workers} worker{'s' if workers > 1 else ''}")
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
    if claim is not None:
      claim.close()
  log.info("Stopped: every accepted request answered")


def _bound(host: str, port: int) -> tuple[socket.socket, socket.socket | None]:
  """A socket bound to host:port, not yet listening (connections are refused until then),
  and this process's claim on the port (`_claim`)."""
  claim = _claim(host, port)
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    if claim is not None:
      claim.close()
    raise UsageError(f"--host={host} --port={port}: cannot listen there ({e.strerror})"
                     ) from None
  return sock, claim


def _claim(host: str, port: int) -> socket.socket | None:
  """A Linux abstract Unix socket named by the address and port, bound while this server
  lives: a second server starting on them meanwhile is refused at once. (SO_REUSEADDR, which
  a restart needs while the last run's connections linger in TIME_WAIT, lets two sockets bind
  a port that neither listens on yet: the second would find out in listen(), after its
  warm-up. A server on the wildcard address and one on a single address of the same port are
  not told apart here: the later listen() says it in one line.) None where there are no
  abstract sockets, or for port 0 (the system picks a free one)."""
  if not port or not sys.platform.startswith("linux"):
    return None
  claim = socket.socket(socket.AF_UNIX)
  try:
    claim.bind(f"\0transformer_jax-serve-{host}-{port}")
  except OSError:
    claim.close()
    raise UsageError(f"--host={host} --port={port}: another transformer-jax-serve is starting "
                     "or serving there") from None
  return claim
