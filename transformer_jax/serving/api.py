"""The HTTP endpoints (Starlette, served by uvicorn):

  POST /translate     LibreTranslate's API (`q` a string or a list, `source`, `target`,
                      `format=text`, `alternatives`, `api_key`), so its clients work as is
  GET  /languages     LibreTranslate's: the run's languages (a multilingual run's targets:
                      its tags' languages, chosen by `target`)
  POST /v1/translate  ours: per-request decoding options, n-best with scores and alignments
  GET  /v1/info       what the page offers (languages, beam, alignments)
  GET  /              the page: type or paste, see translations, alternatives, alignments
  GET  /health, GET /metrics (Prometheus text)

A request's fields are read as LibreTranslate reads them: from a JSON body (Content-Type
application/json) alone, or else from the query string and a form body (urlencoded or
multipart), the query string's value first. `api_key` is taken and ignored (no keys here);
`format=html` is refused (it translates text, not markup). A source longer than the model
reads is translated from its first subwords, a translation its length cap stopped returned
unfinished: each is a line of the response's `warnings` (naming the sentence: `q[2]: ...`).

Every refusal is a 4xx or 5xx with a one-line JSON `{"error": ...}` (an unknown path or
method too): a body over the limit (413), too many sentences (413), malformed JSON (NaN and
infinities included) or form, a body of another content type (415), text that is not UTF-8
or not Unicode (a lone surrogate, named by its field), empty text, an unknown language or
option, an option of another type or range than its declaration's (config.fields.Option:
`options.beam_size: "4" is not an integer`) or one the engine cannot honour (400), a full
queue (503 with Retry-After), a request past its timeout (504). A client that leaves while
its request waits is dropped from the queue; an engine call that fails is tried again
request by request, so only the request that broke it fails."""

from __future__ import annotations

import asyncio
import dataclasses
import email.parser
import email.policy
import json
import logging
import math
import re
import time
import typing
from pathlib import Path
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from transformer_jax.config import fields as config_fields
from transformer_jax.config.sections import DecodeConfig
from transformer_jax.errors import ConfigError
from transformer_jax.serving.batcher import Batcher, Closed, QueueFull
from transformer_jax.serving.metrics import Metrics
from transformer_jax.serving.service import REQUEST_OPTIONS, Options

log = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("page.html")  # (the page at `/`: the package's data)
_OPTION_TYPES = typing.get_type_hints(DecodeConfig)  # (a request's options: read once)


@dataclasses.dataclass(frozen=True)
class Limits:
  max_body_bytes: int = 1 << 20
  max_sentences: int = 256      # per request
  max_chars: int = 2000         # per sentence
  timeout_s: float = 60.0       # per request, queueing included
  max_beam_size: int = 16       # beam_size (and alternatives + 1) a request may ask for


class Refused(Exception):
  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


def make_app(service, batcher: Batcher, metrics: Metrics, limits: Limits = Limits()) -> Starlette:
  defaults = service.decode_config(Options())
  async def body(request: Request) -> dict:
    """The request's fields (`_fields_of`), the body within the size limit."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
      raise Refused(413, f"request body of {declared} bytes; at most {limits.max_body_bytes}")
    raw = bytearray()
    async for chunk in request.stream():
      raw += chunk
      if len(raw) > limits.max_body_bytes:
        raise Refused(413, f"request body over {limits.max_body_bytes} bytes")
    return _fields_of(bytes(raw), request.headers.get("content-type", ""),
                      request.url.query)

  def sentences_of(value, name: str) -> list[str]:
    if value is None:
      raise Refused(400, f"no {name} in the request (a JSON body, a form or the query string)")
    sentences = [value] if isinstance(value, str) else value
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
      raise Refused(400, f"{name} must be a string or a list of strings")
    if not sentences or not any(s.strip() for s in sentences):
      raise Refused(400, f"{name} is empty")
    if len(sentences) > limits.max_sentences:
      raise Refused(413, f"{len(sentences)} sentences in one request; at most "
                    f"{limits.max_sentences}")
    longest = max(len(s) for s in sentences)
    if longest > limits.max_chars:
      raise Refused(413, f"a sentence of {longest} characters; at most {limits.max_chars}")
    return sentences

  async def translated(request: Request, sentences, prefixes, options: Options):
    """The engine's `Translated` of each sentence, batched with other requests'; a client
    that disconnects meanwhile leaves the queue untranslated (ClientDisconnect)."""
    try:
      decode = service.decode_config(options)
    except ConfigError as e:
      raise Refused(400, str(e)) from None
    if decode.beam_size > limits.max_beam_size:  # (a new beam width compiles new programs)
      raise Refused(400, f"beam_size={decode.beam_size}; at most {limits.max_beam_size}")
    # (the options as values that differ from the run's: requests that ask for the same
    # decoding in other words, `beam_size: 4` of a beam-4 run, share batches)
    options = dataclasses.replace(options, decode=tuple(
        (k, getattr(decode, k)) for k in REQUEST_OPTIONS.values()
        if getattr(decode, k, None) != getattr(defaults, k, None)))
    waiting = asyncio.ensure_future(batcher.translate(sentences, prefixes, options))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
      done, _ = await asyncio.wait({waiting, gone}, timeout=limits.timeout_s,
                                   return_when=asyncio.FIRST_COMPLETED)
      if waiting in done:
        return waiting.result()
      waiting.cancel()  # (the batcher drops a request still waiting; one running is let be)
      if gone in done:
        raise ClientDisconnect()
      raise asyncio.TimeoutError()
    except QueueFull:
      raise Refused(503, "the server is busy: its queue is full; retry shortly") from None
    except Closed:
      raise Refused(503, "the server is shutting down") from None
    except asyncio.TimeoutError:
      raise Refused(504, f"not translated within {limits.timeout_s:g} s") from None
    finally:
      gone.cancel()

  async def libretranslate(request: Request):
    fields = await body(request)
    sentences = sentences_of(fields.get("q", fields.get("q[]")), "q")
    source, target = fields.get("source", "auto"), fields.get("target")
    if source not in ("auto", *service.sources):
      raise Refused(400, f"source language {source!r} is not served (this model: "
                    f"{'/'.join(service.sources)} -> {', '.join(service.targets)})")
    check_target(target)
    if fields.get("format", "text") != "text":
      raise Refused(400, f"format {fields.get('format')!r} is not served: this server "
                    "translates plain text (format=text), not markup")
    alternatives = _alternatives(fields.get("alternatives", 0), limits.max_beam_size - 1)
    decode = {}
    if alternatives > 0:
      beam = max(alternatives + 1, service.beam_size)
      decode = {"nbest": alternatives + 1, "beam_size": beam}
    results = await translated(request, sentences, [""] * len(sentences),
                               Options(tuple(sorted(decode.items())), target=target))
    texts = [r.hypotheses[0]["translation"] if r.hypotheses else "" for r in results]
    alts = [[h["translation"] for h in r.hypotheses[1:]] for r in results]
    one = isinstance(fields.get("q", fields.get("q[]")), str)
    out = {"translatedText": texts[0] if one else texts}
    if alternatives > 0:
      out["alternatives"] = alts[0] if one else alts
    return _with_warnings(out, results, "q" if one else "q[{}]")

  def check_target(target):
    try:
      service.check_target(target)
    except ConfigError as e:
      raise Refused(400, str(e)) from None

  async def native(request: Request):
    fields = await body(request)
    sentences = sentences_of(fields.get("text"), "text")
    target = fields.get("target", service.target_lang)
    check_target(target)
    given = fields.get("options", {})
    if not isinstance(given, dict):
      raise Refused(400, "options must be an object")
    unknown = sorted(set(given) - {*REQUEST_OPTIONS, "seed", "prefix", "alignments"})
    if unknown:
      raise Refused(400, f"unknown option {unknown[0]!r}; options: "
                    f"{', '.join((*REQUEST_OPTIONS, 'seed', 'prefix', 'alignments'))}")
    decode = tuple(sorted(_option(name, given[name], limits.max_beam_size)
                          for name in REQUEST_OPTIONS if name in given))
    prefix = given.get("prefix", "")
    prefixes = [prefix] * len(sentences) if isinstance(prefix, str) else prefix
    if (not isinstance(prefixes, list) or len(prefixes) != len(sentences)
        or not all(isinstance(p, str) for p in prefixes)):
      raise Refused(400, "prefix must be a string or one string per sentence")
    seed = given.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 <= seed < 2**31):
      raise Refused(400, f"seed={seed!r} is not an integer in [0, 2^31)")
    options = Options(decode, seed, bool(given.get("alignments", False)), target)
    results = await translated(request, sentences, prefixes, options)
    out = {"translations": [r.hypotheses for r in results]}
    if "id" in fields:
      out["id"] = fields["id"]
    return _with_warnings(out, results, "text" if isinstance(fields["text"], str)
                          else "text[{}]")

  def endpoint(name: str, handler):
    async def run(request: Request) -> Response:
      start = time.monotonic()
      try:
        response = JSONResponse(await handler(request))
      except Refused as e:
        response = JSONResponse({"error": str(e)}, e.status,
                                headers={"Retry-After": "1"} if e.status == 503 else None)
      except ClientDisconnect:
        response = Response(status_code=499)  # (nobody reads it)
      except Exception as e:  # (a failure of the engine: one line, counted, the server goes on)
        log.exception("%s failed", name)
        response = JSONResponse({"error": f"translation failed: {type(e).__name__}: "
                                          f"{str(e).splitlines()[0] if str(e) else ''}"}, 500)
      metrics.request(name, response.status_code, time.monotonic() - start)
      return response
    return run

  async def languages(request: Request):
    return [{"code": source, "name": source, "targets": service.targets}
            for source in service.sources]

  async def health(request: Request):
    return {"status": "ok", "engine": service.name}

  async def info(request: Request):
    """What the page offers: languages, the run's beam, whether alignments are served."""
    return {"engine": service.name, "sources": service.sources, "targets": service.targets,
            "target": service.target_lang, "beam_size": service.beam_size,
            "max_beam_size": limits.max_beam_size, "alignments": service.aligns,
            "beam_search": service.beam_search,
            "max_sentences": limits.max_sentences, "max_chars": limits.max_chars}

  async def page(request: Request):
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))

  async def metrics_text(request: Request):
    return PlainTextResponse(metrics.text(), media_type="text/plain; version=0.0.4")

  async def not_routed(request: Request, e: HTTPException):
    return JSONResponse({"error": f"{request.method} {request.url.path}: {e.detail}"},
                        e.status_code, headers=e.headers)

  return Starlette(exception_handlers={HTTPException: not_routed}, routes=[
      Route("/", page, methods=["GET"]),
      Route("/v1/info", endpoint("v1/info", info), methods=["GET"]),
      Route("/translate", endpoint("translate", libretranslate), methods=["POST"]),
      Route("/v1/translate", endpoint("v1/translate", native), methods=["POST"]),
      Route("/languages", endpoint("languages", languages), methods=["GET"]),
      Route("/health", endpoint("health", health), methods=["GET"]),
      Route("/metrics", metrics_text, methods=["GET"])])


def _option(name: str, value, max_beam_size: int) -> tuple:
  """(config.decode's key, the value) of a request's `options.<name>`, typed and ranged as
  the option's declaration says (a bool is no integer, a string no number), or a 400
  naming it."""
  key = REQUEST_OPTIONS[name]
  kind, declared = _OPTION_TYPES[key], config_fields.options(DecodeConfig)[key]
  what = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[kind]
  taken = (int, float) if kind is float else kind
  if not isinstance(value, taken) or (kind is not bool and isinstance(value, bool)):
    raise Refused(400, f"options.{name}: {json.dumps(value)} is not {what}")
  if not declared.within(value):
    raise Refused(400, f"options.{name}: {json.dumps(value)} must be {declared.range_text()}")
  if key == "beam_size" and value > max_beam_size:  # (a new beam width compiles new programs)
    raise Refused(400, f"options.{name}: {value} is more than this server's {max_beam_size}")
  return key, kind(value)


def _alternatives(value, most: int) -> int:
  """LibreTranslate's `alternatives`: an integer in [0, `most`], or its text (as a form
  sends it, and as LibreTranslate takes it in JSON too), or a 400 naming it."""
  if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
    value = int(value)
  if not isinstance(value, int) or isinstance(value, bool):
    raise Refused(400, f"alternatives: {json.dumps(value)} is not an integer")
  if not 0 <= value <= most:
    raise Refused(400, f"alternatives: {value} must be in [0, {most}] (this server's beams "
                  f"are at most {most + 1} wide)")
  return value


def _fields_of(raw: bytes, content_type: str, query: str) -> dict:
  """A request's fields as LibreTranslate reads them: a JSON body's alone, else the query
  string's over a form body's (urlencoded, the default, or multipart); a body of another
  content type (text/plain, say), or JSON sent as a form (`curl -d` without a header), is
  refused naming what was received."""
  media = content_type.split(";")[0].strip().lower()
  if media == "application/json" or media.endswith("+json"):
    return _json_fields(_utf8(raw, "request body"))
  looks_like_json = raw.lstrip()[:1] in (b"{", b"[")
  if media == "multipart/form-data":
    form = _multipart(raw, content_type)
  elif media in ("", "application/x-www-form-urlencoded") and not looks_like_json or not raw:
    form = _form(_utf8(raw, "request body"), "form")
  else:
    received = f"Content-Type {media!r}" if media else "no Content-Type"
    raise Refused(415, f"a body of {received} is not read as sent: send JSON "
                  "(application/json) or a form (application/x-www-form-urlencoded or "
                  "multipart/form-data)" + (" (it looks like JSON: send it with Content-Type: "
                                           "application/json)" if looks_like_json else ""))
  return {**form, **_form(query, "query string")}


def _form(text: str, where: str) -> dict:
  """The fields of URL-encoded `text` (a form body or the query string); a field whose
  percent-escaped bytes are not UTF-8 is a 400 naming it."""
  form = parse_qs(text, keep_blank_values=True, errors="surrogateescape")
  for name, values in form.items():
    if any("\udc80" <= char <= "\udcff" for value in (name, *values) for char in value):
      raise Refused(400, f"{where} field {name!r} is not UTF-8 (its percent-escaped bytes)")
  return _fields(form)


def _json_fields(text: str) -> dict:
  """A JSON body's object, refusing what JSON has no place for: NaN, infinities (and numbers
  too large for a float, read as infinite) and lone surrogates (valid JSON escapes of no
  Unicode character, which a tokenizer cannot encode), each named."""
  def not_finite(value: str):
    raise Refused(400, f"malformed JSON: {value} is not a number JSON allows")

  def number(text_: str) -> float:
    value = float(text_)
    if not math.isfinite(value):
      not_finite(text_)
    return value

  try:
    fields = json.loads(text or "{}", parse_constant=not_finite, parse_float=number)
  except json.JSONDecodeError as e:
    raise Refused(400, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}"
                  ) from None
  if not isinstance(fields, dict):
    raise Refused(400, "the JSON body must be an object")
  _check_unicode(fields, "")
  return fields


def _check_unicode(value, name: str):
  """A 400 naming the first string of a JSON value (a field, an item, a key) holding a lone
  surrogate."""
  if isinstance(value, str):
    for i, char in enumerate(value):
      if "\ud800" <= char <= "\udfff":
        raise Refused(400, f"{name or 'a key'} is not Unicode text: a lone surrogate "
                      f"(\\u{ord(char):04x}) at character {i}")
  elif isinstance(value, dict):
    for key, item in value.items():
      _check_unicode(key, "")
      _check_unicode(item, f"{name}.{key}" if name else key)
  elif isinstance(value, list):
    for i, item in enumerate(value):
      _check_unicode(item, f"{name}[{i}]")


def _with_warnings(out: dict, results, field: str) -> dict:
  """`out` with `warnings`: each sentence's notes (service.Translated), named by `field` (its
  index put in), when there are any."""
  warnings = [f"{field.format(i)}: {note}" for i, r in enumerate(results) for note in r.notes]
  return {**out, "warnings": warnings} if warnings else out


async def _disconnected(request: Request):
  """Returns when the client disconnects (its body read: what is left to receive is that)."""
  while (await request.receive())["type"] != "http.disconnect":
    pass


def _utf8(raw: bytes, what: str) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise Refused(400, f"{what} is not UTF-8 (byte {e.start})") from None


def _fields(form: dict[str, list[str]]) -> dict:
  """A form's fields: a value each, or the list of a repeated field (and of `q[]`)."""
  return {k: v if len(v) > 1 or k == "q[]" else v[0] for k, v in form.items()}


def _multipart(raw: bytes, content_type: str) -> dict:
  """The fields of a multipart/form-data body (as LibreTranslate's own page and curl -F send
  them), by the standard library's MIME parser."""
  message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
      b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw)
  if not message.is_multipart():
    raise Refused(400, "malformed multipart/form-data body (no parts: a boundary missing?)")
  form: dict[str, list[str]] = {}
  for part in message.iter_parts():
    name = part.get_param("name", header="content-disposition")
    if name:
      form.setdefault(name, []).append(_utf8(part.get_payload(decode=True) or b"",
                                             f"form field {name!r}"))
  return _fields(form)
