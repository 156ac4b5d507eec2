"""Models trained elsewhere, read into a workdir that every tool takes as a trained run."""
