"""The safetensors reader (no torch): every dtype a checkpoint holds, by name and shape, as the
safetensors library writes it; a damaged file is a one-line error."""

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from transformer_jax.errors import CheckpointError
from transformer_jax.interop import safetensors


def test_tensors_read_as_the_library_wrote_them(tmp_path):
  tensors = {"a.weight": torch.randn(3, 4), "b": torch.randn(5, dtype=torch.float16),
             "c": torch.randn(2, 3).to(torch.bfloat16), "ids": torch.arange(7)}
  save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
  read = safetensors.load(tmp_path / "model.safetensors")
  assert sorted(read) == sorted(tensors)
  assert read["c"].dtype == ml_dtypes.bfloat16 and read["ids"].dtype == np.int64
  for name, value in tensors.items():
    np.testing.assert_array_equal(read[name].astype(np.float32), value.float().numpy())


def test_a_damaged_file_is_named(tmp_path):
  save_file({"a": torch.ones(1000)}, tmp_path / "model.safetensors")
  data = (tmp_path / "model.safetensors").read_bytes()
  (tmp_path / "model.safetensors").write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors "
                                            "file \\(tensor a lies past the end"):
    safetensors.load(tmp_path / "model.safetensors")
