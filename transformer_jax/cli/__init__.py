"""Command-line tools: one thin module per console script, all run by runner.py."""
