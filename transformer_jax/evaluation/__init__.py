"""Evaluation: sacreBLEU/chrF scoring, the evaluator (loss + BLEU of a set), attention maps."""
