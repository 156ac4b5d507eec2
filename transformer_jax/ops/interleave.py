"""Rows split into k interleaved pieces and merged back: with the rows split over devices in
contiguous blocks, every piece keeps rows on every device (micro-batches, loss chunks)."""


def split_interleaved(x, k: int):
  """(N, ...) -> (k, N/k, ...) with row r in piece r % k."""
  return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def merge_interleaved(x):
  """The inverse of `split_interleaved`."""
  return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])
