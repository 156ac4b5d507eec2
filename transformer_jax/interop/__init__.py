"""Interoperation: our models as CTranslate2 model folders (export, and translating with
them), and models trained elsewhere (Hugging Face Marian) read in as runs; one row per model
option in `model_options` says how each side holds it."""
