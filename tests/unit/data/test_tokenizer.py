"""SentencePiece training, id conventions, round trips and reuse."""

import pytest

from transformer_jax.data import tokenizer as T
from transformer_jax.errors import DataError

SENTENCES = ["Ein Mann fährt Fahrrad.", "A man rides a bike.", "Zwei Hunde spielen im Schnee.",
             "Two dogs play in the snow.", "Eine Frau liest ein Buch.", "A woman reads a book."]


def test_train_encode_decode_round_trip(tmp_path):
  tok = T.train_tokenizer(SENTENCES * 20, 60, tmp_path / "spm.model")
  assert (tmp_path / "spm.model").is_file()
  for s in SENTENCES:
    ids = tok.encode(s)
    assert ids[-1] == T.EOS_ID and T.PAD_ID not in ids
    assert tok.detokenize(ids) == s
  # Decoding stops at EOS and skips padding.
  assert tok.detokenize(tok.encode("Ein Mann") + [5, 6, 0, 0]) == "Ein Mann"


def test_load_or_train_reuses_the_saved_model(tmp_path):
  path = tmp_path / "spm.model"
  first = T.load_or_train(path, lambda: SENTENCES * 20, 60, 1000)
  calls = []
  second = T.load_or_train(path, lambda: calls.append(1) or SENTENCES, 60, 1000)
  assert not calls  # not retrained
  assert second.model_proto == first.model_proto


def test_missing_tokenizer_file_is_named(tmp_path):
  with pytest.raises(DataError, match="spm.model does not exist"):
    T.Tokenizer.load(tmp_path / "spm.model")


def test_training_sample_is_bounded_by_sentences_and_characters():
  corpus = (f"sentence number {i}" for i in range(100_000))  # a stream, read once
  sample = T.training_sample(corpus, max_sentences=5000, seed=0, max_chars=20_000)
  assert 0 < sum(map(len, sample)) <= 20_000
  assert len(sample) == len(set(sample)) > 900
  # Uniform over the stream, not its head: about half from the second half.
  late = sum(int(s.split()[-1]) >= 50_000 for s in sample) / len(sample)
  assert 0.4 < late < 0.6
  assert len(T.training_sample(iter(["", "a", "b"]), max_sentences=10)) == 2  # empties skipped


def test_a_damaged_tokenizer_file_is_named(tmp_path):
  good = tmp_path / "spm.model"
  T.train_tokenizer(["ein kleiner test", "a small test"] * 20, 40, good)
  bad = tmp_path / "truncated.model"
  bad.write_bytes(good.read_bytes()[:100])
  with pytest.raises(DataError, match=r"tokenizer .*truncated.model is damaged or not a "
                                      r"SentencePiece model \(.*\); restore the file"):
    T.Tokenizer.load(bad)


def _paired(tmp_path):
  """Two unigram models, German for the source and English for the target, and one
  vocabulary holding both models' pieces except one of "A man rides a bike."'s (which is then
  out of the vocabulary)."""
  german, english = SENTENCES[0::2], SENTENCES[1::2]
  source = T.train_tokenizer(german * 20, 40, tmp_path / "de.model")
  target = T.train_tokenizer(english * 20, 40, tmp_path / "en.model")
  pieces = dict.fromkeys(["<pad>", "</s>", "<unk>"] + source.pieces(range(3, source.vocab_size))
                         + target.pieces(range(3, target.vocab_size)))
  source_pieces = set(source.pieces(range(source.vocab_size)))
  dropped = next(p for p in target.encode_pieces("A man rides a bike.") if p not in source_pieces)
  vocabulary = [p for p in pieces if p != dropped]
  data = T.PairedTokenizer.bundle(source.model_proto, target.model_proto, vocabulary)
  (tmp_path / "spm.model").write_bytes(data)
  return source, target, vocabulary


def test_a_paired_tokenizer_encodes_each_side_with_its_model_into_one_vocabulary(tmp_path):
  source, target, vocabulary = _paired(tmp_path)
  tok = T.Tokenizer.load(tmp_path / "spm.model")
  assert isinstance(tok, T.PairedTokenizer) and tok.vocab_size == len(vocabulary)
  german, english = "Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."
  assert tok.pieces(tok.encode(german)[:-1]) == source.encode_pieces(german)
  ids = tok.encode(english, "target")
  assert ids[-1] == T.EOS_ID and tok.pieces(ids[:-1]) == target.encode_pieces(english)
  assert tok.detokenize(ids) == english
  assert tok.detokenize(tok.encode(german), "source") == german
  # A piece outside the vocabulary is UNK; the same text's ids agree in a batch.
  assert T.UNK_ID in tok.encode("A man rides a bike.", "target")
  assert tok.encode_batch([english, german], "target") == [ids, tok.encode(german, "target")]
  assert tok.tag_id(vocabulary[5], "here") == 5
  # The fingerprint is the file's: another vocabulary order, another fingerprint.
  other = T.PairedTokenizer.bundle(source.model_proto, target.model_proto,
                                   vocabulary[:3] + vocabulary[3:][::-1])
  assert T.Tokenizer.from_bytes(other).fingerprint != tok.fingerprint


def test_a_damaged_paired_tokenizer_or_wrong_special_pieces_are_one_line_errors(tmp_path):
  source, target, vocabulary = _paired(tmp_path)
  data = (tmp_path / "spm.model").read_bytes()
  with pytest.raises(T.TokenizerDamaged, match="x.model is damaged or not a paired"):
    T.Tokenizer.from_bytes(data[: len(data) // 2], "x.model")
  swapped = T.PairedTokenizer.bundle(source.model_proto, target.model_proto,
                                     ["</s>", "<pad>"] + vocabulary[2:])
  with pytest.raises(DataError, match=r"pieces \('</s>', '<pad>', '<unk>'\) at ids 0, 1, 2"):
    T.Tokenizer.from_bytes(swapped)


def test_a_paired_tokenizer_samples_each_side_with_its_model_deterministically(tmp_path):
  _paired(tmp_path)
  tok = T.Tokenizer.load(tmp_path / "spm.model")
  texts = ["Zwei Hunde spielen im Schnee."] * 8
  first = tok.sample_batch(texts, 0.1, -1, seed=3)
  assert first == tok.sample_batch(texts, 0.1, -1, seed=3)  # (the seed decides)
  assert len({tuple(ids) for ids in first}) > 1  # (segmentations differ)
  assert all(tok.detokenize(ids, "source") == texts[0] for ids in first)
  english = tok.sample_batch(["Two dogs play in the snow."] * 4, 0.1, -1, seed=3, side="target")
  assert all(tok.detokenize(ids) == "Two dogs play in the snow." for ids in english)


def test_the_seed_sentencepiece_reads_as_none_samples_as_seed_0(tmp_path):
  """2^32 - 1 (a draw from [0, 2^32)) would keep the previous seed: it is taken as 0."""
  _paired(tmp_path)
  tok = T.Tokenizer.load(tmp_path / "spm.model")
  texts = ["Zwei Hunde spielen im Schnee."] * 8
  seed_0, seed_5 = (tok.sample_batch(texts, 0.1, -1, seed=s) for s in (0, 5))
  assert seed_0 != seed_5
  assert tok.sample_batch(texts, 0.1, -1, seed=2**32 - 1) == seed_0


def test_a_leading_language_tag_is_one_piece_as_training_puts_it_before_a_source(tmp_path):
  """Joint (tags reserved at training) and paired (tags in the vocabulary): `>>xx<< text`
  encodes as the tag's id and then the text's ids, in every way a text is encoded."""
  joint = T.train_tokenizer(SENTENCES * 20, 80, tmp_path / "joint.model",
                            tags=(">>de<<", ">>en<<"))
  source, target, vocabulary = _paired(tmp_path)
  paired = T.Tokenizer.from_bytes(T.PairedTokenizer.bundle(
      source.model_proto, target.model_proto, vocabulary[:3] + [">>en<<"] + vocabulary[3:]))
  text = "Zwei Hunde spielen im Schnee."
  for tok, tag in ((joint, ">>en<<"), (paired, ">>en<<")):
    tag_id = tok.tag_id(tag, "test")
    assert tok.language_tags and tok.leading_tag(f" {tag} {text}") == tag
    assert tok.encode(f"{tag} {text}") == [tag_id] + tok.encode(text)
    assert tok.encode_batch([f"{tag} {text}"]) == [[tag_id] + tok.encode(text)]
    assert tok.encode_pieces(f"{tag} {text}") == [tag] + tok.encode_pieces(text)
    ids, words = tok.encode_words(f"{tag} {text}")
    assert ids == [tag_id] + tok.encode(text)[:-1] and words[0] == 0 and words[-1] == 5
    sampled = tok.sample_batch([f"{tag} {text}"] * 4, 0.1, -1, seed=1)
    assert all(ids[0] == tag_id and ids[1] != tag_id for ids in sampled)
  # (a tag-like text the vocabulary lacks is text)
  assert joint.leading_tag(">>fr<< Hallo") == ""


def test_a_paired_translation_starting_with_an_unknown_piece_keeps_its_words(tmp_path):
  """UNK decodes to ' ⁇ ' (a leading space, stripped from the text): still word 0."""
  _paired(tmp_path)
  tok = T.Tokenizer.load(tmp_path / "spm.model")
  ids = tok.encode("Two dogs play.", "target")[:-1]
  text, words = tok.detokenize_words([T.UNK_ID] + ids)
  assert text.split() == ["⁇", "Two", "dogs", "play."]
  assert words == [0] + [w + 1 for w in tok.detokenize_words(ids)[1]]
