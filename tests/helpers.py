"""Helpers shared by the test files: tiny configs and sections, a fixed packed batch, running
tools in-process and training in a subprocess, and what the shared fixtures are built from."""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer_jax.config import sections
from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import tiny
from transformer_jax.data import corpus
from transformer_jax.data.plan import data_plan
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import fsdp
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training.loop import train_and_evaluate
from transformer_jax.training.preemption import ENV as FAULTS_ENV
from transformer_jax.training.state import create_state
from transformer_jax.workdir.preparation import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ configs
# The tiny config with one layer per stack: for tests of what does not depend on depth
# (resume, preemption, hosts, meshes, sweeps), half the tracing and compiling of every run.
ONE_LAYER = {"model.num_encoder_layers": 1, "model.num_decoder_layers": 1}
ONE_LAYER_FLAGS = [f"--config.{k}={v}" for k, v in ONE_LAYER.items()]


def with_overrides(config, overrides: dict):
  """`config` (changed in place) with `section.key=value` (or run-level `key=value`)
  overrides."""
  for key, value in overrides.items():
    *path, name = key.split(".")
    node = config
    for part in path:
      node = node[part]
    node[name] = value
  return config


def tiny_config(**overrides):
  """configs/tiny.py with `section.key=value` (or run-level `key=value`) overrides."""
  return with_overrides(tiny.get_config(), overrides)


def tiny_train_config(**overrides) -> sections.TrainConfig:
  return from_config_dict(tiny_config(**overrides))


def section(name: str, **overrides):
  """A config section (`"model"`, `"decode"`, ...) of the tiny config, with overrides."""
  cls = sections.SECTIONS[name]
  return cls(**{**tiny.get_config()[name].to_dict(), **overrides})


# ------------------------------------------------------------------------------ models
@functools.lru_cache(maxsize=None)
def _mesh():
  return mesh_lib.make_mesh(sections.ParallelismConfig((1, 1, 1), ()), jax.devices()[:1])


def fsdp_split(params, shardings) -> tuple[list, list]:
  """(the parameters that `fsdp` splits, those it keeps whole on each device)."""
  split, whole = [], []
  for leaf, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
    (whole if fsdp.split_dimension(sharding) is None else split).append(leaf)
  return split, whole


def whole_gradient_sums(module, split_params) -> list[tuple[int, ...]]:
  """The all-reduces of an optimised HLO `module` whose result is a whole matrix that `fsdp`
  splits (`split_params`: arrays or their abstract values, with their shardings), as it is or
  as its pieces stacked: its gradient summed whole, where FSDP reduce-scatters it. (Vectors
  are left out: the TPU compiler sums a split vector of a few hundred floats, a projection's bias,
  by an all-reduce and a slice, its cost model's choice for arrays that small.)"""
  whole = set()
  for x in split_params:
    if len(x.shape) > 1:
      dim, n = fsdp.split_dimension(x.sharding), x.sharding.mesh.shape["fsdp"]
      whole |= {tuple(x.shape),
                (n, *x.shape[:dim], x.shape[dim] // n, *x.shape[dim + 1:])}
  return [shape for shape in module.result_shapes("all-reduce") if shape in whole]

def tiny_setup(**overrides):
  """(config, model, initial train state) of the tiny config on one device."""
  cfg = tiny_train_config(**overrides)
  model = Transformer(cfg.model)
  state, _ = create_state(cfg, model, _mesh(), jax.random.PRNGKey(cfg.seed))
  return cfg, model, state


def fixed_batch(rows=8, length=16, vocab=500, seed=0):
  """A deterministic packed batch: two examples per row."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, (rows, length)).astype(np.int32)
  seg = np.zeros((rows, length), np.int32)
  pos = np.zeros((rows, length), np.int32)
  for r in range(rows):
    a = 3 + r % 5
    b = length - a - 2
    seg[r, :a], seg[r, a:a + b] = 1, 2
    pos[r, :a], pos[r, a:a + b] = np.arange(a), np.arange(b)
  ids = np.where(seg > 0, ids, 0)
  ids[np.arange(rows), seg.argmin(1) - 1] = 1  # EOS closes each row's last example
  return {"inputs": ids, "targets": ids.copy(), "inputs_positions": pos,
          "targets_positions": pos, "inputs_segment_ids": seg, "targets_segment_ids": seg}


def stack_layers(params, cfg: sections.ModelConfig):
  """Per-layer parameters in the scanned layout (the inverse of model.unstack_layers)."""
  params = dict(params)
  for prefix, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
    layers = [params.pop(f"{prefix}_{i}") for i in range(n)]
    params[f"{prefix}_layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
  return params


@functools.partial(jax.jit, static_argnames="model")
def sequence_log_prob(model, params, inputs_BS, targets_BT):
  """Total log-probability of each target sequence (ending in EOS, padded with 0) under the
  model, from one teacher-forced pass: the reference the decoders are checked against."""
  logits = model.apply({"params": params}, inputs_BS, targets_BT)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  token_lp = jnp.take_along_axis(log_probs, targets_BT[..., None], axis=-1)[..., 0]
  return jnp.sum(jnp.where(targets_BT > 0, token_lp, 0.0), axis=-1)


# ------------------------------------------------------------------------------ data
SRC = ["ein kleiner hund", "zwei katzen schlafen", "ein mann", "eine frau liest ein buch",
       "kinder spielen im park", ("ein sehr langer satz " * 8).strip(), "der hund rennt", "ja"]
TGT = ["a small dog", "two cats sleep", "a man", "a woman reads a book",
       "children play in the park", ("a very long sentence " * 8).strip(), "the dog runs", "yes"]


def small_corpus(tmp_path: Path):
  """(data config, tokenizer) of an 8-pair corpus (train and val: the same pairs) in tmp_path;
  one pair is longer than the 16-token length limit."""
  folder = tmp_path / "corpus"
  folder.mkdir()
  for split in ("train", "val"):
    for lang, lines in (("de", SRC), ("en", TGT)):
      (folder / f"{split}.{lang}.gz").write_bytes(
          gzip.compress("".join(x + "\n" for x in lines).encode()))
  cfg = section("data", data_dir=str(folder), cache_dir=str(tmp_path / "tfds"), test_split="",
                max_source_length=16, max_target_length=16, batch_size=4, num_threads=1)
  return cfg, train_tokenizer(SRC + TGT, 70, tmp_path / "spm.model")


def unpack_batch(batch) -> list[tuple[tuple, tuple]]:
  """The (inputs, targets) examples of a packed batch, recovered from segment ids (their
  positions checked: they restart at 0 in every packed example)."""
  out = []
  for row in range(batch["inputs"].shape[0]):
    for seg in sorted(set(batch["inputs_segment_ids"][row]) - {0}):
      src_mask = batch["inputs_segment_ids"][row] == seg
      tgt_mask = batch["targets_segment_ids"][row] == seg
      src, tgt = batch["inputs"][row][src_mask], batch["targets"][row][tgt_mask]
      np.testing.assert_array_equal(batch["inputs_positions"][row][src_mask],
                                    np.arange(len(src)))
      np.testing.assert_array_equal(batch["targets_positions"][row][tgt_mask],
                                    np.arange(len(tgt)))
      out.append((tuple(src), tuple(tgt)))
  return out


def assert_resumes_at_the_same_batches(make_dataset, skip: int, check: int):
  """A dataset from `make_dataset()` restored from its iterator's state after `skip` batches
  makes the same next `check` batches (every key, every value) as the one it came from."""
  it = iter(make_dataset())
  for _ in range(skip):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(check)]
  resumed = iter(make_dataset())
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    assert set(got) == set(want)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


# ------------------------------------------------------------------------------ shared fixtures
def prepare_tiny_corpus(cache: Path):
  corpus.get_builder(corpus.corpus_spec(tiny_train_config(**{"data.cache_dir": str(cache)}).data))


def train_tiny_tokenizer(out: Path, cache: Path):
  cfg = tiny_train_config(**{"data.cache_dir": str(cache)})
  load_tokenizer(cfg, out, data_plan(cfg.data))


def train_in_process(workdir: Path, cache: Path, tokenizer: Path, **overrides) -> dict:
  """Trains the tiny config in this process (its tokenizer copied in first)."""
  workdir.mkdir(parents=True, exist_ok=True)
  if not (workdir / "spm.model").exists():
    shutil.copy(tokenizer, workdir / "spm.model")
  c = tiny_config(**{"data.cache_dir": str(cache), **overrides})
  return train_and_evaluate(from_config_dict(c), workdir, c.to_dict())


def copy_run(run: Path, to: Path) -> Path:
  """A writable copy of a trained run."""
  shutil.copytree(run, to, ignore=shutil.ignore_patterns("eval", "attention"))
  return to


def read_metrics(workdir: Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def logged(workdir: Path, key: str, step: int):
  """The last value of `key` logged at `step`."""
  return [r[key] for r in read_metrics(workdir) if key in r and r["step"] == step][-1]


def checkpoint_steps(workdir: Path, folder: str = "checkpoints") -> list[int]:
  return sorted(int(p.name) for p in (workdir / folder).iterdir() if p.name.isdigit())


# ------------------------------------------------------------------------------ tools
def saved_state(workdir: Path, step: int | None = None):
  """The train state (step, params, optimizer state) saved in `workdir` at `step` (default:
  the newest), as numpy arrays."""
  directory = workdir / "checkpoints"
  step = step or max(checkpoint_steps(workdir))
  return ocp.StandardCheckpointer().restore(directory / str(step) / "state")


def assert_bitwise_equal(a, b):
  leaves_a, tree_a = jax.tree_util.tree_flatten(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    assert np.array_equal(np.asarray(x), np.asarray(y)), "states differ"


def run_tool(main, *argv: str, stdin: bytes | None = None):
  """Runs a CLI module's `main` in this process on `argv` (and `stdin`); returns its exit
  status and what it wrote to stdout and stderr."""
  out, err = io.StringIO(), io.StringIO()
  stdin_stream = io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8")
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
      _replaced_stdin(stdin_stream):
    with pytest.raises(SystemExit) as exit_info:
      main(["tool", *argv])
  return exit_info.value.code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _replaced_stdin(stream):
  saved = sys.stdin
  sys.stdin = stream
  try:
    yield
  finally:
    sys.stdin = saved


def one_line_error(stderr: str) -> str:
  """The message of a tool that failed the way a user's mistake must: one line, no traceback."""
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert "Traceback" not in stderr, stderr[-3000:]
  assert lines, "no error message"
  return lines[-1]


def train_process(workdir: Path, cache: Path, *overrides: str, tokenizer: Path | None = None,
                  fault: str = "", check: bool = True, timeout: float = 300, env=None,
                  config: str = "configs/tiny.py"):
  """`python train.py --config=configs/tiny.py` (or `config`) in a subprocess (with the shared
  TFDS cache and, when given, a trained tokenizer copied into the workdir)."""
  if tokenizer is not None:
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "spm.model").exists():
      shutil.copy(tokenizer, workdir / "spm.model")
  env = dict(os.environ if env is None else env)
  env.pop(FAULTS_ENV, None)
  if fault:
    env[FAULTS_ENV] = fault
  cmd = [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}",
         f"--config.data.cache_dir={cache}", *overrides]
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
  if check:
    assert r.returncode == 0, r.stderr[-4000:]
  return r


def xla_env(devices: int, **extra) -> dict:
  """This process's environment for a child on `devices` CPU devices, with the suite's XLA
  flags (tests/caches.py) kept."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", **extra)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
