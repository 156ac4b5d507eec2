"""The server under load on loopback: C concurrent clients sending test2016 sentences, singly
or in lists, against the same engine's offline speed measured in this run; then a mixed load.

  python benchmarks/serve_load.py --workdir=runs/default --clients=1,8,32,128 --sentences=400

For each C: sentences/s through the server, p50/p95/p99 request latency, and the ratio to
the offline speed (`Translator.translate` of all the sentences at once, warm: at the run's
decoding batch size, and at the server's --max_batch_sentences); every answer checked against
its request's id and the offline translation of its sentence (none lost, duplicated or
another's). Then the mixed load (--mixed_clients clients): requests of one to four sentences
of mixed lengths, each with its own length_penalty and beam_size (at most the run's: the
server's programs serve them all), each answer's texts checked against the same request sent
alone (the server's answer with nobody else there; its scores' largest difference printed:
the slots may run at a wider class under load, which rounds a bf16 product otherwise), and
each latency against that alone.
Last, the programs the server compiled or loaded after its warm-up (its /metrics; 0 expected).
The clients are threads in this process, each on its own kept-alive connection (on a 2-core
machine they share the CPU with the server: the ratios are lower bounds).
"""

import http.client
import itertools
import json
import random
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
from transformer_jax.serving.server import sentences_at_once

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained run.", required=True)
flags.DEFINE_list("clients", ["1", "8", "32", "128"], "Concurrent clients.")
flags.DEFINE_integer("sentences", 400, "test2016 sentences sent per client count.")
flags.DEFINE_enum("mode", "single", ["single", "list"], "One sentence a request, or lists of "
                  "--list_size.")
flags.DEFINE_integer("list_size", 8, "Sentences per request in list mode.")
flags.DEFINE_integer("max_batch_sentences", 0, "The server's batch size (0: its auto).")
flags.DEFINE_float("max_wait_ms", 50.0, "The server's batching wait.")
flags.DEFINE_integer("workers", 2, "The server's batches at once.")
flags.DEFINE_enum("engine", "jax", ["jax", "ctranslate2"], "The server's engine.")
flags.DEFINE_integer("mixed_clients", 8, "Clients of the mixed load (0: none).")
flags.DEFINE_integer("mixed_requests", 96, "Requests of the mixed load.")

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
  at_once = sentences_at_once(FLAGS.max_batch_sentences, FLAGS.engine)
  at_batch, _ = _offline(sentences, [f"batch_size={at_once}"])
  proc, url = _start(FLAGS.workdir)
  try:
    for clients in map(int, FLAGS.clients):  # (warm: each client count's path once)
      _load(url, sentences, expected, clients)
    print(f"engine {FLAGS.engine}; offline: {offline_speed:.1f} sentences/s at the run's "
          f"batch of {translator_batch()}, {at_batch:.1f} at the server's "
          f"{at_once}; {FLAGS.mode} requests" + (
              f", wait {FLAGS.max_wait_ms:g} ms, {FLAGS.workers} worker(s)"
              if FLAGS.engine != "jax" else f", {at_once} slots in flight"))
    print("| clients | sentences/s | vs offline | vs offline at the server's size | p50 (ms) "
          "| p95 (ms) | p99 (ms) | wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for clients in map(int, FLAGS.clients):
      r = _load(url, sentences, expected, clients)
      print(f"| {clients} | {r['sentences_per_sec']:.1f} | "
            f"{r['sentences_per_sec'] / offline_speed:.2f}x | "
            f"{r['sentences_per_sec'] / at_batch:.2f}x | {r['p50'] * 1e3:.0f} | "
            f"{r['p95'] * 1e3:.0f} | {r['p99'] * 1e3:.0f} | {r['wrong']}/{r['requests']} |",
            flush=True)
    if FLAGS.mixed_clients:
      _mixed(url, sentences)
    print(f"programs compiled or loaded after the warm-up: {_programs_after_warm_up(url)}")
  finally:
    proc.terminate()
    proc.wait()


def _mixed(url: str, sentences: list[str]):
  """Requests of 1-4 sentences of mixed lengths, each its own length_penalty and beam_size:
  each alone first (its answer and latency with nobody else there), then all of them from
  --mixed_clients clients at once."""
  rng = random.Random(0)
  beam = json.loads((Path(FLAGS.workdir) / "config.json").read_text())["decode"]["beam_size"]
  requests = []
  for i in range(FLAGS.mixed_requests):
    rows = rng.sample(range(len(sentences)), rng.choice([1, 1, 2, 4]))
    requests.append({"id": i, "text": [sentences[r] for r in rows],
                     "options": {"length_penalty": rng.choice([0.0, 0.6, 1.0]),
                                 "beam_size": rng.choice(sorted({1, 2, beam}))}})
  alone = [_post(url + "/v1/translate", r) for r in requests]

  def texts(answer):
    return [[h["translation"] for h in hyps] for hyps in answer["translations"]]

  def scores(answer):
    return [h["score"] for hyps in answer["translations"] for h in hyps]

  def send(request):  # (the same texts as alone, and how far its scores are from alone's)
    seconds, answer = _post(url + "/v1/translate", request)
    ours = alone[request["id"]][1]
    same = texts(answer) == texts(ours)
    return seconds, same, max((abs(a - b) for a, b in zip(scores(answer), scores(ours))
                               if same), default=0.0)
  with ThreadPoolExecutor(FLAGS.mixed_clients) as pool:
    loaded = list(pool.map(send, requests))
  alone_s = sorted(s for s, _ in alone)
  loaded_s = sorted(s for s, _, _ in loaded)
  q = statistics.quantiles(loaded_s, n=100)
  print(f"mixed load: {FLAGS.mixed_clients} clients, {len(requests)} requests of 1-4 sentences, "
        f"length_penalty in (0, 0.6, 1), beam_size in {sorted({1, 2, beam})}: median "
        f"{statistics.median(loaded_s) * 1e3:.0f} ms (alone: "
        f"{statistics.median(alone_s) * 1e3:.0f} ms), p99 {q[98] * 1e3:.0f} ms = "
        f"{q[98] / statistics.median(loaded_s):.2f}x the median; answers whose texts differ "
        f"from alone: {sum(not same for _, same, _ in loaded)}/{len(loaded)}, largest score "
        f"difference of the others {max(d for _, _, d in loaded):.2e}", flush=True)


def _programs_after_warm_up(url: str) -> str:
  address = urllib.parse.urlsplit(url)
  connection = http.client.HTTPConnection(address.netloc, timeout=60)
  connection.request("GET", "/metrics")
  body = connection.getresponse().read().decode()
  found = re.search(r"^transformer_jax_programs_after_warm_up_total (\d+)", body, re.M)
  return found.group(1) if found else "?"


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
