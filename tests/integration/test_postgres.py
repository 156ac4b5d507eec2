"""Sweep storage on a real PostgreSQL server (throwaway, on 127.0.0.1): a wrong password is one
line naming the host, and sweep workers started at the same instant on a fresh database all
join the study."""

import subprocess
import sys

import pytest

from tests import helpers, postgres

pytestmark = pytest.mark.skipif(not postgres.available(),
                                reason=f"no PostgreSQL server programs in {postgres.BIN}")

OPEN = """
import sys
from transformer_jax.sweeps import study
storage = study.open_storage(sys.argv[1], 60, 120, 1)
print("joined", len(storage.get_all_studies()))
"""


@pytest.fixture(scope="module")
def server():
  with postgres.Server() as db:
    yield db


def test_a_wrong_password_is_one_line_naming_the_host(server):
  from transformer_jax.errors import UsageError
  from transformer_jax.sweeps import study
  server.create_database("login")
  with pytest.raises(UsageError, match=rf"--storage=postgresql\+psycopg2://postgres:\*\*\*@"
                                       rf"127.0.0.1:{server.port}/login: cannot connect to "
                                       rf"127.0.0.1:{server.port}: .*password authentication "
                                       "failed"):
    study.open_storage(server.url("login", password="wrong"), 60, 120, 1)


def test_workers_starting_at_the_same_instant_on_a_fresh_database_all_join(server):
  server.create_database("fresh")
  procs = [subprocess.Popen([sys.executable, "-c", OPEN, server.url("fresh")], cwd=helpers.ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(4)]
  results = [p.communicate(timeout=120) for p in procs]
  for p, (out, err) in zip(procs, results):
    assert p.returncode == 0, err[-2000:]
    assert out.strip() == "joined 0"
