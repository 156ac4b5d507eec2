"""The server's port: taken before the model loads, so that a port in use is one line at
once rather than a traceback after the warm-up."""

import socket

import pytest

from transformer_jax.errors import UsageError
from transformer_jax.serving import server


def test_a_port_in_use_is_one_line_before_anything_loads():
  with socket.create_server(("127.0.0.1", 0)) as taken:
    port = taken.getsockname()[1]
    with pytest.raises(UsageError, match=rf"^--host=127.0.0.1 --port={port}: cannot listen "
                                         r"there \(Address already in use\)$"):
      server._bound("127.0.0.1", port)
  free = server._bound("127.0.0.1", 0)
  try:  # (bound, not listening: a client is refused until the warm-up is over)
    with pytest.raises(ConnectionRefusedError):
      socket.create_connection(free.getsockname(), timeout=5)
  finally:
    free.close()
