"""Reporting: metric files (JSONL, TensorBoard), the progress line, plots, log set-up."""
