"""Export: a trained run as a model folder for another runtime (CTranslate2)."""
