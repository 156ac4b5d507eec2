"""The server on the tiny run, over loopback, in one process from start to SIGTERM: the
LibreTranslate client, our endpoint against `Translator` (what `translate` prints), 32
concurrent clients each answered its own translation, a client that leaves mid-request, and
SIGTERM under load: every accepted request answered, exit 0."""

import io
import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.helpers import ROOT
from transformer_jax.data import text
from transformer_jax.inference.translator import Translator

SOURCES = list(itertools.islice(
    text.read_lines(ROOT / "transformer_jax/corpora/multi30k/val.de.gz"), 32))


def _start(workdir, *flags: str):
  """The server process and its URL, once it listens; its log collected in the background."""
  proc = subprocess.Popen([sys.executable, "-m", "transformer_jax.cli.serve",
                           f"--workdir={workdir}", "--port=0", "--max_wait_ms=20",
                           "--warm_up_batches=1", *flags],
                          cwd=ROOT, stderr=subprocess.PIPE, text=True)
  log = []
  for line in proc.stderr:
    log.append(line)
    found = re.search(r"Serving on (http://\S+)", line)
    if found:
      threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
      return proc, found.group(1), log
  raise AssertionError("the server did not start:\n" + "".join(log[-30:]))


def _post(url: str, payload: dict, timeout: float = 120) -> tuple[int, dict]:
  request = urllib.request.Request(url, json.dumps(payload).encode(),
                                   {"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def _same(served: list[dict], offline, aligned=None):
  assert [h["translation"] for h in served] == [h.text for h in offline]
  np.testing.assert_allclose([h["score"] for h in served], [h.score for h in offline],
                             rtol=1e-5)
  if aligned is not None:
    assert [h["alignment"] for h in served] == aligned


def test_the_server_answers_clients_and_stops_cleanly(tiny_run):
  proc, url, log = _start(tiny_run)
  try:
    best = Translator([str(tiny_run)]).translate(SOURCES)
    assert LibreTranslateAPI(url).translate(SOURCES[0], "de", "en") == best[0][0].text

    # Our endpoint: translate's n-best, scores and alignments for the same options.
    options = Translator([str(tiny_run)], decode_overrides=["beam_size=3", "nbest=2"],
                         alignments=True)
    nbest = options.translate(SOURCES[:3])
    status, answer = _post(url + "/v1/translate", {"text": SOURCES[:3], "options": {
        "beam_size": 3, "nbest": 2, "alignments": True}})
    assert status == 200
    for i, (served, offline) in enumerate(zip(answer["translations"], nbest)):
      _same(served, offline, options.alignments([SOURCES[i]] * len(offline), offline))

    # 32 concurrent single-sentence clients, each with an id: its own translation.
    def client(i):
      return i, _post(url + "/v1/translate", {"id": i, "text": SOURCES[i]})
    with ThreadPoolExecutor(32) as pool:
      answers = list(pool.map(client, range(32)))
    for i, (status, answer) in answers:
      assert status == 200 and answer["id"] == i
      _same(answer["translations"][0], best[i][:1])

    # A client that sends half its body and leaves: dropped; the server goes on.
    with socket.create_connection(re.search(r"//([\d.]+):(\d+)", url).groups()) as s:
      s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{\"q\": ")
    status, answer = _post(url + "/translate", {"q": SOURCES[1], "target": "en"})
    assert status == 200 and answer["translatedText"] == best[1][0].text
    # (the 20-step model may not end a translation: a cut one is said, as `ended` says)
    assert ("warnings" in answer) == (not best[1][0].ended)
    status, answer = _post(url + "/translate", {"q": SOURCES[1], "target": "xx"})
    assert status == 400 and "'xx' is not served" in answer["error"]

    # SIGTERM while 24 requests are in flight: each answered, then exit 0.
    with ThreadPoolExecutor(24) as pool:
      futures = [pool.submit(_post, url + "/v1/translate", {"id": i, "text": SOURCES[i]})
                 for i in range(24)]
      threading.Event().wait(0.3)
      proc.send_signal(signal.SIGTERM)
      answered = [f.result() for f in futures]
    assert [(s, a["id"]) for s, a in answered] == [(200, i) for i in range(24)]
    assert proc.wait(60) == 0, "".join(log[-30:])
    metrics = "".join(log)
    assert "Stopped: every accepted request answered" in metrics
  finally:
    if proc.poll() is None:
      proc.kill()


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                    reason="Chromium and ChromeDriver from the distribution (apt install "
                           "chromium chromium-driver; .ci/run installs them) are not here")
def test_the_page_translates_what_is_typed_with_alternatives_and_alignments(tiny_run, tmp_path):
  """The page at `/` in the distribution's headless Chromium: text typed and a click give
  `Translator`'s n-best (the run's beam, two alternatives) and the first sentence's alignment
  grid; a refused request shows the server's error; the screenshot is not blank."""
  from PIL import Image
  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait

  proc, url, log = _start(tiny_run, "--warm_up_batches=0")
  options = webdriver.ChromeOptions()
  options.binary_location = str(CHROMIUM)
  for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--window-size=1200,900",
               f"--user-data-dir={tmp_path / 'profile'}"):
    options.add_argument(flag)
  browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
  try:
    browser.get(url + "/")
    wait = WebDriverWait(browser, 120)
    wait.until(lambda b: b.find_element(By.ID, "go").is_enabled())
    assert [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#target option")] == ["en"]
    typed = SOURCES[:2]
    browser.find_element(By.ID, "text").send_keys("\n".join(typed))
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#output .best")) == 2)

    # (two alternatives: nbest 3, the beam widened to 3 where the run's is narrower)
    offline = Translator([str(tiny_run)], decode_overrides=["beam_size=3", "nbest=3"],
                         alignments=True)
    expected = offline.translate(typed)
    shown = browser.find_elements(By.CSS_SELECTOR, "#output .sentence")
    for sentence, hyps in zip(shown, expected):
      assert [(e.find_element(By.CLASS_NAME, "text").text,
               e.find_element(By.CLASS_NAME, "score").text)
              for e in sentence.find_elements(By.CSS_SELECTOR, ".best, .alternative")] == \
          [(h.text, f"{h.score:.3f}") for h in hyps]
    links = offline.alignments([typed[0]], expected[0][:1])[0].split()
    cells = browser.find_elements(By.CSS_SELECTOR, "#grid td.link")
    assert sorted(f"{c.get_attribute('data-source')}-{c.get_attribute('data-target')}"
                  for c in cells) == sorted(links) and links
    # (the grid's words: those the alignment counts, each side's whitespace-separated words)
    assert [th.get_attribute("textContent") for th in
            browser.find_elements(By.CSS_SELECTOR, "#grid thead th")][1:] == typed[0].split()
    assert [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#grid tbody th")] == \
        expected[0][0].text.split()

    picture = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L")
    histogram = picture.histogram()
    assert max(histogram) < 0.95 * sum(histogram), "the screenshot is one colour"
    assert sum(1 for n in histogram if n) > 20  # (text and the grid: many shades)

    browser.find_element(By.ID, "beam").clear()
    browser.find_element(By.ID, "beam").send_keys("99")
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: b.find_element(By.ID, "error").is_displayed())
    assert browser.find_element(By.ID, "error").text == (
        "options.beam_size: 99 is more than this server's 16")
  finally:
    browser.quit()
    proc.terminate()
    proc.wait(60)
