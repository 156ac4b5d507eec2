"""The server's port and limits: a port in use, or one another server is warming up on, and
limits that contradict each other are one line at once, before the model loads, rather than a
traceback after the warm-up."""

import socket
import types

import pytest

from tests import helpers
from transformer_jax.errors import UsageError
from transformer_jax.serving import server


def test_a_port_in_use_is_one_line_before_anything_loads():
  with socket.create_server(("127.0.0.1", 0)) as taken:
    port = taken.getsockname()[1]
    with pytest.raises(UsageError, match=rf"^--host=127.0.0.1 --port={port}: cannot listen "
                                         r"there \(Address already in use\)$"):
      server._bound("127.0.0.1", port)
  free, claim = server._bound("127.0.0.1", 0)
  try:  # (bound, not listening: a client is refused until the warm-up is over)
    with pytest.raises(ConnectionRefusedError):
      socket.create_connection(free.getsockname(), timeout=5)
  finally:
    free.close()


def test_a_second_server_starting_on_the_port_stops_before_its_warm_up():
  """Both bind before either listens (SO_REUSEADDR lets them): the second is refused at once,
  not in listen() after its warm-up; once the first has gone, the port is free again."""
  port = helpers.free_port()
  first, claim = server._bound("127.0.0.1", port)
  try:
    with pytest.raises(UsageError, match=rf"^--host=127.0.0.1 --port={port}: another "
                                         "transformer-jax-serve is starting or serving there$"):
      server._bound("127.0.0.1", port)
    elsewhere, its_claim = server._bound("127.0.0.2", port)  # (another address: its own)
    elsewhere.close()
    its_claim.close()
  finally:
    first.close()
    claim.close()
  again, claim = server._bound("127.0.0.1", port)
  again.close()
  claim.close()


def test_limits_that_contradict_each_other_are_one_line_before_anything():
  args = types.SimpleNamespace(max_request_sentences=300, max_queue=256, timeout_s=60.0,
                               max_wait_ms=50.0)
  with pytest.raises(UsageError, match=r"^--max_request_sentences=300 is more than "
                                       r"--max_queue=256: a request that large could never "):
    server.serve(args)  # (before the port, the model or anything the other flags name)
  args = types.SimpleNamespace(max_request_sentences=8, max_queue=256, timeout_s=0.0,
                               max_wait_ms=50.0)
  with pytest.raises(UsageError, match=r"^--timeout_s=0 must be > 0 and --max_wait_ms=50 >= "):
    server.serve(args)  # (every request would be a 504)


def test_the_server_decodes_16_sentences_at_once_on_a_cpu_unless_told(monkeypatch):
  """Auto (0): our engine's slots 16 on a CPU (a step costs as its slots, filled or not), 32
  on an accelerator and for CTranslate2's calls; a number given is kept."""
  assert server.sentences_at_once(0, "jax") == 16
  assert server.sentences_at_once(0, "ctranslate2") == 32
  assert server.sentences_at_once(8, "jax") == 8
  monkeypatch.setattr(server.jax, "default_backend", lambda: "gpu")
  assert server.sentences_at_once(0, "jax") == 32
