"""Reads a safetensors file into numpy arrays, without torch.

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the tensors' bytes. bf16 arrives as ml_dtypes' bfloat16 (JAX's).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from transformer_jax.errors import CheckpointError

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
          "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
          "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def load(path: str | Path) -> dict[str, np.ndarray]:
  """Every tensor of the file, by name (arrays over one read of the file)."""
  path = Path(path)
  data = path.read_bytes()
  try:
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    tensors = {}
    for name, entry in header.items():
      if name == "__metadata__":
        continue
      if entry["dtype"] not in DTYPES:
        raise ValueError(f"tensor {name} has dtype {entry['dtype']}, which is not read")
      begin, end = entry["data_offsets"]
      if not 0 <= begin <= end <= len(body):
        raise ValueError(f"tensor {name} lies past the end of the file")
      tensors[name] = np.frombuffer(body[begin:end], DTYPES[entry["dtype"]]).reshape(
          entry["shape"])
  except (struct.error, ValueError, KeyError, TypeError) as e:
    raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
  return tensors
