"""The endpoints on a stand-in engine (each translation names its source): LibreTranslate's
fields and answers, ours with options and ids, and every bad request a one-line JSON error
after which the server goes on serving."""

import json
import socket
import threading
import time
import types

import pytest
import uvicorn
from starlette.testclient import TestClient

from tests import helpers
from transformer_jax.errors import ConfigError
from transformer_jax.serving.api import Limits, make_app
from transformer_jax.serving.batcher import Batcher
from transformer_jax.serving.metrics import Metrics
from transformer_jax.serving.service import Options, Translated


class Echo:
  """Translates "x" into "<x>" (n-best: "<x> #k"; into French "fr<x>"), score -k, with a
  note for a sentence that starts with "long"; records its batches."""
  name, source_lang, target_lang, beam_size, aligns, beam_search = "echo", "de", "en", 4, True, True
  sources, targets = ["de"], ["en", "fr"]

  def check_target(self, target):
    if target not in self.targets:
      raise ConfigError(f"target language {target!r} is not served (this model: de -> en, fr)")

  def __init__(self):
    self.batches, self.options = [], []

  def decode_config(self, options):
    values = {"beam_size": 4, "nbest": 1, **dict(options.decode)}
    if values["beam_size"] < values["nbest"]:
      raise ConfigError(f"config.decode.nbest={values['nbest']} must be in [1, beam_size="
                        f"{values['beam_size']}]")
    return types.SimpleNamespace(**values)

  def translate(self, sentences, prefixes, options):
    if "crash" in sentences:
      raise RuntimeError("the engine broke\nsecond line")
    self.batches.append(list(sentences))
    self.options.append(options)
    nbest = dict(options.decode).get("nbest", 1)
    language = "fr" if options.target == "fr" else ""
    return [Translated([{"translation": f"{p}{language}<{s}>" + (f" #{k}" if k else ""),
                         "score": -float(k)} for k in range(nbest)] if s.strip() else [],
                       ["cut to 8 subwords"] if s.startswith("long") else [])
            for s, p in zip(sentences, prefixes)]


@pytest.fixture()
def client():
  engine, metrics = Echo(), Metrics()
  batcher = Batcher(engine, metrics, max_sentences=8, max_wait_s=0.001, max_queue=64)
  with TestClient(make_app(engine, batcher, metrics, Limits(max_body_bytes=4096,
                                                            max_sentences=16))) as c:
    c.engine = engine
    yield c
  batcher.close()


def test_libretranslate_fields_as_its_clients_send_them(client):
  form = client.post("/translate", data={"q": "Hallo", "source": "de", "target": "en"})
  assert form.json() == {"translatedText": "<Hallo>"}
  listed = client.post("/translate", json={"q": ["a", "b"], "source": "auto", "target": "en",
                                           "alternatives": 2, "format": "text"})
  assert listed.json() == {"translatedText": ["<a>", "<b>"],
                           "alternatives": [["<a> #1", "<a> #2"], ["<b> #1", "<b> #2"]]}
  assert client.get("/languages").json() == [{"code": "de", "name": "de",
                                               "targets": ["en", "fr"]}]


def test_multipart_forms_as_curl_F_sends_them(client):
  r = client.post("/translate", files={"q": (None, "Grüße"), "source": (None, "de"),
                                       "target": (None, "en")})
  assert r.json() == {"translatedText": "<Grüße>"}
  r = client.post("/translate", content=b"--x\r\nContent-Disposition: form-data; "
                  b'name="q"\r\n\r\n\xff\r\n--x--\r\n',
                  headers={"Content-Type": "multipart/form-data; boundary=x"})
  assert r.status_code == 400 and r.json() == {"error": "form field 'q' is not UTF-8 (byte 0)"}
  r = client.post("/translate", content=b"q=a", headers={"Content-Type": "multipart/form-data"})
  assert r.status_code == 400 and r.json()["error"].startswith("malformed multipart/form-data")


def test_an_unknown_path_or_method_is_a_json_error(client):
  assert client.get("/translat").json() == {"error": "GET /translat: Not Found"}
  r = client.get("/translate")
  assert r.status_code == 405 and r.json() == {"error": "GET /translate: Method Not Allowed"}


def test_the_target_language_chooses_the_translation(client):
  """A multilingual run: `target` picks the language (the engine's tag before the source; it
  is one of the request's Options, which batches never mix: test_batcher)."""
  french = client.post("/translate", json={"q": "a", "source": "de", "target": "fr"})
  assert french.json() == {"translatedText": "fr<a>"}
  ours = client.post("/v1/translate", json={"text": "a", "target": "fr"})
  assert ours.json()["translations"] == [[{"translation": "fr<a>", "score": 0.0}]]
  assert client.post("/v1/translate", json={"text": "a"}).json()["translations"] == [
      [{"translation": "<a>", "score": 0.0}]]  # (the run's first target by default)
  r = client.post("/v1/translate", json={"text": "a", "target": "it"})
  assert r.status_code == 400 and r.json()["error"] == (
      "target language 'it' is not served (this model: de -> en, fr)")


def test_the_page_and_what_it_asks_the_server(client):
  page = client.get("/")
  assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
  assert '<textarea id="text"' in page.text and 'fetch("v1/translate"' in page.text
  assert client.get("/v1/info").json() == {
      "engine": "echo", "sources": ["de"], "targets": ["en", "fr"], "target": "en",
      "beam_size": 4, "max_beam_size": 16, "alignments": True, "beam_search": True,
      "max_sentences": 16, "max_chars": 2000}


def test_options_that_say_the_defaults_share_a_batch_with_none(client):
  """`beam_size: 4` of a beam-4 engine is no option: such requests batch with plain ones."""
  r = client.post("/v1/translate", json={"text": "a", "options": {"beam_size": 4, "nbest": 1}})
  assert r.status_code == 200
  assert client.engine.options == [Options(target="en")]


def test_our_endpoint_takes_options_prefixes_and_an_id(client):
  r = client.post("/v1/translate", json={"text": ["a", "b"], "id": "req-9",
                                         "options": {"nbest": 2, "prefix": ["x", ""]}})
  assert r.json() == {"id": "req-9", "translations": [
      [{"translation": "x<a>", "score": 0.0}, {"translation": "x<a> #1", "score": -1.0}],
      [{"translation": "<b>", "score": 0.0}, {"translation": "<b> #1", "score": -1.0}]]}


@pytest.mark.parametrize("request_kw, status, error", [
    ({"json": {"q": "", "source": "de", "target": "en"}}, 400, "q is empty"),
    ({"content": b"q=\xff\xfe&target=en"}, 400, "request body is not UTF-8 (byte 2)"),
    ({"content": b'{"q": "a",', "headers": {"Content-Type": "application/json"}}, 400,
     "malformed JSON: Expecting property name enclosed in double quotes at line 1 column 11"),
    ({"content": b"q=" + b"a" * 10_000}, 413, "request body of 10002 bytes; at most 4096"),
    ({"json": {"q": "a", "source": "de", "target": "xx"}}, 400,
     "target language 'xx' is not served (this model: de -> en, fr)"),
    ({"json": {"q": ["a"] * 10_000, "target": "en"}}, 413, "request body of"),
    ({"json": {"q": ["a"] * 17, "target": "en"}}, 413,
     "17 sentences in one request; at most 16"),
    ({"json": {"q": "a", "target": "en", "format": "html"}}, 400, "format 'html'"),
])
def test_bad_requests_are_one_line_json_errors_and_the_server_goes_on(client, request_kw,
                                                                      status, error):
  r = client.post("/translate", **request_kw)
  assert r.status_code == status and r.json()["error"].startswith(error), r.text
  assert "\n" not in r.json()["error"]
  assert client.post("/translate", json={"q": "ok", "target": "en"}).json() == {
      "translatedText": "<ok>"}


def test_bad_options_name_themselves(client):
  r = client.post("/v1/translate", json={"text": ["a", "b"], "options": {"prefix": [1, ""]}})
  assert r.status_code == 400 and r.json()["error"] == (
      "prefix must be a string or one string per sentence")
  r = client.post("/translate", json={"q": "a", "target": "en", "alternatives": 40})
  assert r.status_code == 400 and r.json()["error"] == (
      "alternatives: 40 must be in [0, 15] (this server's beams are at most 16 wide)")
  r = client.post("/v1/translate", json={"text": "a", "options": {"beem_size": 2}})
  assert r.status_code == 400 and r.json()["error"].startswith("unknown option 'beem_size'")
  r = client.post("/v1/translate", json={"text": "a", "options": {"beam_size": 2, "nbest": 3}})
  assert r.status_code == 400 and r.json()["error"] == (
      "config.decode.nbest=3 must be in [1, beam_size=2]")


@pytest.mark.parametrize("options, error", [
    ({"beam_size": "4"}, 'options.beam_size: "4" is not an integer'),
    ({"beam_size": 2.5}, "options.beam_size: 2.5 is not an integer"),
    ({"nbest": True}, "options.nbest: true is not an integer"),
    ({"temperature": "0.7", "sampling": True}, 'options.temperature: "0.7" is not a number'),
    ({"sampling": 1}, "options.sampling: 1 is not true or false"),
    ({"beam_size": 0}, "options.beam_size: 0 must be >= 1"),
    ({"sampling": True, "top_p": 1.5}, "options.top_p: 1.5 must be in (0, 1]"),
    ({"sampling": True, "temperature": 0}, "options.temperature: 0 must be > 0"),
    ({"repetition_penalty": -1}, "options.repetition_penalty: -1 must be > 0"),
    ({"no_repeat_ngram_size": 1000000},  # (each size is a program of its own)
     "options.no_repeat_ngram_size: 1000000 must be in [0, 16]"),
    ({"beam_size": 17}, "options.beam_size: 17 is more than this server's 16")])
def test_an_option_of_the_wrong_type_or_out_of_range_is_refused_naming_its_field(client, options,
                                                                              error):
  """Each request field typed and ranged as its option's declaration says."""
  r = client.post("/v1/translate", json={"text": "a", "options": options})
  assert (r.status_code, r.json()) == (400, {"error": error})
  assert client.engine.options == []


@pytest.mark.parametrize("request_kw, error", [
    ({"json": {"q": "a", "target": "en", "alternatives": -1}},
     "alternatives: -1 must be in [0, 15] (this server's beams are at most 16 wide)"),
    ({"data": {"q": "a", "target": "en", "alternatives": "-1"}},
     "alternatives: -1 must be in [0, 15] (this server's beams are at most 16 wide)"),
    ({"json": {"q": "a", "target": "en", "alternatives": 2.5}},
     "alternatives: 2.5 is not an integer"),
    ({"json": {"q": "a", "target": "en", "alternatives": True}},
     "alternatives: true is not an integer"),
    ({"data": {"q": "a", "target": "en", "alternatives": "two"}},
     'alternatives: "two" is not an integer')])
def test_libretranslates_alternatives_is_a_count_or_a_named_error(client, request_kw, error):
  r = client.post("/translate", **request_kw)
  assert (r.status_code, r.json()) == (400, {"error": error})
  form = client.post("/translate", data={"q": "a", "target": "en", "alternatives": "1"})
  assert form.json() == {"translatedText": "<a>", "alternatives": ["<a> #1"]}


def test_request_options_are_typed_as_declared_and_cover_the_new_ones(client):
  r = client.post("/v1/translate", json={"text": "a", "options": {
      "sampling": True, "temperature": 1, "no_repeat_ngram_size": 3}})
  assert r.status_code == 200
  (options,) = client.engine.options
  assert dict(options.decode) == {"no_repeat_ngram_size": 3, "sampling": True,
                                  "temperature": 1.0}
  assert isinstance(dict(options.decode)["temperature"], float)


def test_metrics_count_requests_errors_and_batches(client):
  client.post("/translate", json={"q": ["a", "b", "c"], "target": "en"})
  client.post("/translate", json={"q": "a", "target": "zz"})
  text = client.get("/metrics").text
  assert 'transformer_jax_requests_total{endpoint="translate",status="200"} 1' in text
  assert "transformer_jax_request_errors_total 1" in text
  assert "transformer_jax_sentences_total 3" in text
  assert 'transformer_jax_batch_sentences_bucket{le="4"} 1' in text
  json.dumps(text)  # (plain text)


def test_an_engine_failure_is_a_counted_one_line_500_and_the_server_goes_on(client):
  r = client.post("/translate", json={"q": "crash", "target": "en"})
  assert r.status_code == 500 and r.json() == {
      "error": "translation failed: RuntimeError: the engine broke"}
  assert 'endpoint="translate",status="500"} 1' in client.get("/metrics").text
  assert client.post("/translate", json={"q": "ok", "target": "en"}).status_code == 200


def test_fields_in_the_query_string_a_form_or_json_give_one_answer(client):
  """LibreTranslate's reading: a JSON body alone, else the query string's fields over a form
  body's; `api_key` taken (and ignored), `format=text` too."""
  fields = {"q": "Hallo", "source": "de", "target": "en", "format": "text", "api_key": "k",
            "alternatives": "1"}
  expected = client.post("/translate", json=fields).json()
  assert expected == {"translatedText": "<Hallo>", "alternatives": ["<Hallo> #1"]}
  assert client.post("/translate", params=fields).json() == expected  # (no body)
  assert client.post("/translate", params={"q": "Hallo", "alternatives": "1"},
                     data={"q": "other", "source": "de", "target": "en"}).json() == expected
  assert client.post("/translate", params={"q": ["a", "b"], "target": "en"}).json() == {
      "translatedText": ["<a>", "<b>"]}  # (a repeated field: a list, as a form's)
  ignored = client.post("/translate?q=other", json=fields)  # (JSON alone, as LibreTranslate)
  assert ignored.json() == expected
  assert client.post("/v1/translate", params={"text": "Hallo"}).json() == {
      "translations": [[{"translation": "<Hallo>", "score": 0.0}]]}
  r = client.post("/translate", params={"q": "Hallo", "target": "en", "format": "html"})
  assert r.status_code == 400 and r.json()["error"] == (
      "format 'html' is not served: this server translates plain text (format=text), not "
      "markup")
  r = client.post("/translate", params={"target": "en"})
  assert r.status_code == 400 and r.json()["error"] == (
      "no q in the request (a JSON body, a form or the query string)")


def test_a_body_of_another_content_type_is_refused_saying_what_was_received(client):
  r = client.post("/translate", content=b'{"q": "Hallo", "target": "en"}',
                  headers={"Content-Type": "text/plain;charset=UTF-8"})
  assert r.status_code == 415 and r.json()["error"] == (
      "a body of Content-Type 'text/plain' is not read as sent: send JSON (application/json) "
      "or a form (application/x-www-form-urlencoded or multipart/form-data) (it looks like "
      "JSON: send it with Content-Type: application/json)")
  r = client.post("/translate", content=b"q=Hallo", headers={"Content-Type": "text/csv"})
  assert r.status_code == 415 and "looks like JSON" not in r.json()["error"]
  for headers, received in (({}, "no Content-Type"),  # (curl -d: a form's type, or none)
                            ({"Content-Type": "application/x-www-form-urlencoded"},
                             "Content-Type 'application/x-www-form-urlencoded'")):
    r = client.post("/translate", content=b' {"q": "Hallo"}', headers=headers)
    assert r.status_code == 415 and r.json()["error"].startswith(
        f"a body of {received} is not read as sent: ") and "looks like JSON" in r.text
  r = client.post("/translate", content=b'{"q": "Hallo", "target": "en"}',
                  headers={"Content-Type": "application/vnd.api+json"})
  assert r.json() == {"translatedText": "<Hallo>"}


@pytest.mark.parametrize("body, error", [
    ('{"q": "Hallo \\ud800", "target": "en"}',
     "q is not Unicode text: a lone surrogate (\\ud800) at character 6"),
    ('{"q": ["a", "\\udc00b"], "target": "en"}',
     "q[1] is not Unicode text: a lone surrogate (\\udc00) at character 0"),
    ('{"text": "a", "options": {"prefix": "x\\udfff"}}',
     "options.prefix is not Unicode text: a lone surrogate (\\udfff) at character 1"),
    ('{"text": "a", "id": "\\ud83d"}',
     "id is not Unicode text: a lone surrogate (\\ud83d) at character 0"),
    ('{"text": "a", "options": {"length_penalty": NaN}}',
     "malformed JSON: NaN is not a number JSON allows"),
    ('{"text": "a", "options": {"temperature": -Infinity}}',
     "malformed JSON: -Infinity is not a number JSON allows"),
    ('{"text": "a", "options": {"top_p": 1e999}}',
     "malformed JSON: 1e999 is not a number JSON allows"),
])
def test_text_no_tokenizer_can_read_and_numbers_json_has_not_are_named(client, body, error):
  path = "/translate" if '"q"' in body else "/v1/translate"
  r = client.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
  assert r.status_code == 400 and r.json() == {"error": error}
  assert client.engine.batches == []  # (refused before the engine)
  assert client.post("/v1/translate", json={"text": "a \U0001F600"}).status_code == 200


def test_form_and_query_fields_whose_bytes_are_not_utf8_are_named(client):
  """(Percent-escaped: the body itself is ASCII. A replacement character would have been
  translated.)"""
  r = client.post("/translate", content=b"q=%ff%fe&target=en")
  assert r.status_code == 400 and r.json()["error"] == (
      "form field 'q' is not UTF-8 (its percent-escaped bytes)")
  r = client.post("/translate?q=%ED%A0%80&target=en")  # (a surrogate's bytes)
  assert r.status_code == 400 and r.json()["error"] == (
      "query string field 'q' is not UTF-8 (its percent-escaped bytes)")
  assert client.post("/translate?q=Gr%C3%BC%C3%9Fe&target=en").json() == {
      "translatedText": "<Grüße>"}
  assert client.engine.batches == [["Grüße"]]


def test_a_cut_source_or_translation_is_said_in_the_response(client):
  r = client.post("/translate", json={"q": ["a", "long b"], "target": "en"})
  assert r.json() == {"translatedText": ["<a>", "<long b>"],
                      "warnings": ["q[1]: cut to 8 subwords"]}
  r = client.post("/translate", json={"q": "long a", "target": "en"})
  assert r.json()["warnings"] == ["q: cut to 8 subwords"]
  r = client.post("/v1/translate", json={"text": ["long a", "b"]})
  assert r.json()["warnings"] == ["text[0]: cut to 8 subwords"]
  assert "warnings" not in client.post("/v1/translate", json={"text": "b"}).json()


def test_a_client_that_leaves_while_its_request_waits_is_not_translated():
  """A real server (uvicorn): while one request's batch runs, a second client sends its
  request and closes its connection; it leaves the queue and is never translated."""
  class Gated(Echo):
    def __init__(self):
      super().__init__()
      self.gate, self.busy = threading.Event(), threading.Event()

    def translate(self, sentences, prefixes, options):
      self.busy.set()
      self.gate.wait(30)  # (past `until`'s 10 s: a request left in the queue stays there)
      return super().translate(sentences, prefixes, options)

  engine, metrics = Gated(), Metrics()
  batcher = Batcher(engine, metrics, max_sentences=8, max_wait_s=0.0)
  port = helpers.free_port()
  app = make_app(engine, batcher, metrics)
  uvicorn_server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                 log_level="warning"))
  thread = threading.Thread(target=uvicorn_server.run, daemon=True)
  thread.start()

  def send(text: str) -> socket.socket:
    body = json.dumps({"q": text, "target": "en"}).encode()
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(b"POST /translate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return conn

  def until(condition):
    deadline = time.monotonic() + 10
    while not condition():
      assert time.monotonic() < deadline
      time.sleep(0.01)

  try:
    until(lambda: uvicorn_server.started)
    first = send("first")
    until(engine.busy.is_set)  # (its batch runs: the next request waits in the queue)
    leaver = send("leaver")
    until(lambda: metrics.queue_depth == 1)
    leaver.close()
    until(lambda: metrics.queue_depth == 0)  # (dropped while the first batch still runs)
    engine.gate.set()
    assert b'{"translatedText":"<first>"}' in first.recv(4096)
    first.close()
    assert send("after").recv(4096).endswith(b'{"translatedText":"<after>"}')
    assert engine.batches == [["first"], ["after"]]
    until(lambda: 'endpoint="translate",status="499"} 1' in metrics.text())
  finally:
    engine.gate.set()
    uvicorn_server.should_exit = True
    thread.join(10)
    batcher.close()
