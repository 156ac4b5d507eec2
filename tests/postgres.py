"""A throwaway PostgreSQL server for tests: initdb into a temporary folder, a free port on
127.0.0.1, password authentication, stopped (and removed) at the end. The server refuses to
run as root, so as root its programs run as the `postgres` user."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests import helpers


def _server_programs() -> Path:
  """$POSTGRES_BIN, else the newest Debian/Ubuntu install (/usr/lib/postgresql/N/bin)."""
  if "POSTGRES_BIN" in os.environ:
    return Path(os.environ["POSTGRES_BIN"])
  installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                     key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
  return installed[-1].parent if installed else Path("/usr/lib/postgresql/15/bin")


BIN = _server_programs()
PASSWORD = "sweep-test-secret"


def available() -> bool:
  return (BIN / "initdb").is_file() and (os.geteuid() != 0 or shutil.which("runuser")
                                         is not None)


class Server:
  """`with Server() as db: db.url("sweeps")` — a database URL for psycopg2."""

  def __enter__(self):
    self.root = Path(tempfile.mkdtemp(prefix="pg_test_"))
    self.data = self.root / "data"
    self.port = helpers.free_port()
    (self.root / "pw").write_text(PASSWORD)
    if os.geteuid() == 0:
      shutil.chown(self.root, "postgres")
      shutil.chown(self.root / "pw", "postgres")
    self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth-host=md5",
              "--auth-local=trust", f"--pwfile={self.root / 'pw'}", "-E", "UTF8")
    self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-o",
              f"-p {self.port} -h 127.0.0.1 -k {self.root}", "start")
    return self

  def _run(self, program: str, *args: str):
    cmd = [str(BIN / program), *args]
    if os.geteuid() == 0:
      cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)

  def create_database(self, name: str):
    self._run("createdb", "-h", str(self.root), "-p", str(self.port), "-U", "postgres", name)

  def url(self, database: str, password: str = PASSWORD) -> str:
    return f"postgresql+psycopg2://postgres:{password}@127.0.0.1:{self.port}/{database}"

  def __exit__(self, *exc):
    try:
      self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
    finally:
      shutil.rmtree(self.root, ignore_errors=True)
