"""The server under load on loopback: C concurrent clients sending test2016 sentences, singly
or in lists, against the same engine's offline batch speed measured in this run.

  python benchmarks/serve_load.py --workdir=runs/default --clients=1,8,32,128 --sentences=400

For each C: sentences/s through the server, p50/p95/p99 request latency, and the ratio to
the offline speed (`Translator.translate` of all the sentences at once, the engine's batch
decoding, warm); every answer checked against its request's id and the offline translation
of its sentence (none lost, duplicated or another's). The clients are threads in this process,
each on its own kept-alive connection (on a 2-core machine they share the CPU with the server:
the ratio is a lower bound).
"""

import http.client
import itertools
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from absl import app, flags

from transformer_jax.data import text
from transformer_jax.interop import engines
from transformer_jax.parallel import hardware

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained run.", required=True)
flags.DEFINE_list("clients", ["1", "8", "32", "128"], "Concurrent clients.")
flags.DEFINE_integer("sentences", 400, "test2016 sentences sent per client count.")
flags.DEFINE_enum("mode", "single", ["single", "list"], "One sentence a request, or lists of "
                  "--list_size.")
flags.DEFINE_integer("list_size", 8, "Sentences per request in list mode.")
flags.DEFINE_integer("max_batch_sentences", 32, "The server's batch size.")
flags.DEFINE_float("max_wait_ms", 50.0, "The server's batching wait.")
flags.DEFINE_integer("workers", 2, "The server's batches at once.")
flags.DEFINE_enum("engine", "jax", ["jax", "ctranslate2"], "The server's engine.")

SOURCES = Path(__file__).resolve().parents[1] / "transformer_jax/corpora/multi30k/test2016.de.gz"


def _start(workdir: str):
  proc = subprocess.Popen([sys.executable, "-m", "transformer_jax.cli.serve",
                           f"--workdir={workdir}", "--port=0",
                           f"--max_batch_sentences={FLAGS.max_batch_sentences}",
                           f"--max_wait_ms={FLAGS.max_wait_ms}", "--max_queue=100000",
                           f"--workers={FLAGS.workers}",
                           f"--engine={FLAGS.engine}"],
                          stderr=subprocess.PIPE, text=True)
  for line in proc.stderr:
    found = re.search(r"Serving on (http://\S+)", line)
    if found:
      threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
      return proc, found.group(1)
  raise RuntimeError("the server did not start")


_connections = threading.local()


def _post(url: str, payload: dict) -> tuple[float, dict]:
  """POSTs `payload` on this client's kept-alive connection (as a load generator's clients,
  and a browser's, hold theirs); (seconds, the JSON answer)."""
  address = urllib.parse.urlsplit(url)
  if getattr(_connections, "netloc", None) != address.netloc:
    _connections.netloc = address.netloc
    _connections.http = http.client.HTTPConnection(address.netloc, timeout=600)
  start = time.perf_counter()
  _connections.http.request("POST", address.path, json.dumps(payload).encode(),
                            {"Content-Type": "application/json"})
  response = _connections.http.getresponse()
  answer = json.loads(response.read())
  if response.status != 200:
    raise RuntimeError(f"{response.status}: {answer}")
  return time.perf_counter() - start, answer


def _load(url: str, sentences: list[str], expected: list[str], clients: int) -> dict:
  size = 1 if FLAGS.mode == "single" else FLAGS.list_size
  requests = [list(range(i, min(i + size, len(sentences))))
              for i in range(0, len(sentences), size)]

  def send(rows):
    seconds, answer = _post(url + "/v1/translate", {"id": rows[0],
                                                    "text": [sentences[i] for i in rows]})
    got = [t[0]["translation"] if t else "" for t in answer["translations"]]
    ok = answer["id"] == rows[0] and got == [expected[i] for i in rows]
    return seconds, ok
  start = time.perf_counter()
  with ThreadPoolExecutor(clients) as pool:
    results = list(pool.map(send, requests))
  wall = time.perf_counter() - start
  latencies = sorted(s for s, _ in results)
  q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
  return {"sentences_per_sec": len(sentences) / wall, "p50": q[49], "p95": q[94],
          "p99": q[98], "wrong": sum(not ok for _, ok in results), "requests": len(results)}


def main(_):
  sentences = list(itertools.islice(text.read_lines(SOURCES), FLAGS.sentences))
  print(hardware.describe_machine(), flush=True)
  offline_speed, expected = _offline(sentences, [])
  at_batch, _ = _offline(sentences, [f"batch_size={FLAGS.max_batch_sentences}"])
  proc, url = _start(FLAGS.workdir)
  try:
    for clients in map(int, FLAGS.clients):  # (warm: the shapes each load makes, compiled)
      _load(url, sentences, expected, clients)
    print(f"engine {FLAGS.engine}; offline: {offline_speed:.1f} sentences/s in batches of "
          f"{translator_batch()} rows, {at_batch:.1f} in batches of the server's "
          f"{FLAGS.max_batch_sentences}; {FLAGS.mode} requests, wait {FLAGS.max_wait_ms:g} ms, "
          f"{FLAGS.workers} worker(s)")
    print("| clients | sentences/s | vs offline | vs offline at the server's batch | p50 (ms) "
          "| p95 (ms) | p99 (ms) | wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for clients in map(int, FLAGS.clients):
      r = _load(url, sentences, expected, clients)
      print(f"| {clients} | {r['sentences_per_sec']:.1f} | "
            f"{r['sentences_per_sec'] / offline_speed:.2f}x | "
            f"{r['sentences_per_sec'] / at_batch:.2f}x | {r['p50'] * 1e3:.0f} | "
            f"{r['p95'] * 1e3:.0f} | {r['p99'] * 1e3:.0f} | {r['wrong']}/{r['requests']} |",
            flush=True)
  finally:
    proc.terminate()
    proc.wait()


def _offline(sentences: list[str], overrides: list[str]) -> tuple[float, list[str]]:
  """(sentences/s of the faster of two warm translations of all of them by the engine, the
  best ones): the offline side of the ratio at its best, so that noise lowers the ratio."""
  translator = engines.translator(FLAGS.engine, [FLAGS.workdir], decode_overrides=overrides)
  offline = translator.translate(sentences)  # (warm: every shape compiled)
  seconds = []
  for _ in range(2):
    start = time.perf_counter()
    translator.translate(sentences)
    seconds.append(time.perf_counter() - start)
  return len(sentences) / min(seconds), [h[0].text if h else "" for h in offline]


def translator_batch() -> int:
  return json.loads((Path(FLAGS.workdir) / "config.json").read_text())["decode"]["batch_size"]


if __name__ == "__main__":
  app.run(main)
