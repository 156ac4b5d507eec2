"""Numerics: matmuls with backward rules tuned to the backend, dropout, the masking logit,
losses. The one room where backend-specific tuning lives."""
