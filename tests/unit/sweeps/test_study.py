"""Sweep storage URLs: a database server's URL is checked before anything is written, and each
mistake is one line with the password hidden."""

import pytest

from tests import helpers
from transformer_jax.errors import UsageError
from transformer_jax.sweeps import study

HAVE_PSYCOPG3 = __import__("importlib").util.find_spec("psycopg") is not None


def test_a_missing_driver_names_it_and_what_to_install():
  with pytest.raises(UsageError, match=r"--storage=postgresql\+pg8000://bob:\*\*\*@db:5432/s: "
                                       r"its driver 'pg8000' .* is not installed; install pg8000"):
    study.check_server_url("postgresql+pg8000://bob:secret@db:5432/s")


@pytest.mark.skipif(HAVE_PSYCOPG3, reason="psycopg 3 is installed: no missing driver to show")
def test_the_default_postgresql_driver_says_which_url_form_takes_psycopg2():
  with pytest.raises(UsageError, match=r"--storage=postgresql://bob:\*\*\*@db.example:5432/s: "
                                       r"its driver 'psycopg' \(for postgresql://\) is not "
                                       r"installed; pip install 'psycopg\[binary\]' \(or use "
                                       r"postgresql\+psycopg2://"):
    study.check_server_url("postgresql://bob:secret@db.example:5432/s")


def test_urls_that_are_no_database_are_one_line():
  with pytest.raises(UsageError, match="not a database URL"):
    study.check_server_url("db.example:5432")
  with pytest.raises(UsageError, match="SQLAlchemy knows no database 'nosuchdb'"):
    study.check_server_url("nosuchdb://host/x")



def test_an_unreachable_server_is_one_line_naming_host_and_port():
  port = helpers.free_port()  # (nothing listens there)
  with pytest.raises(UsageError, match=rf"--storage=postgresql\+psycopg2://bob:\*\*\*@127.0.0.1:"
                                       rf"{port}/s: cannot connect to 127.0.0.1:{port}: "
                                       r".*(refused|could not connect)"):
    study.open_storage(f"postgresql+psycopg2://bob:secret@127.0.0.1:{port}/s", 60, 120, 1)
