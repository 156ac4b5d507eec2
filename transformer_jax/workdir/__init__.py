"""The workdir: what a run folder holds (layout.py), its checkpoints (checkpoints.py), and what a
run prepares in it before training (preparation.py)."""
