"""Data: text files, corpora as TFDS array_record datasets, the tokenizer, the training
pipeline, evaluation sets, and leak-free splitting of unsplit corpora."""
