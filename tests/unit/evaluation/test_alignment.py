"""Word alignments from the cross-attention: subwords mapped to words, a hand-made model whose
cross-attention is diagonal aligned on the diagonal, Pharaoh's format."""

import flax.linen as nn
import jax
import numpy as np

from tests import helpers
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import UNK_ID, PairedTokenizer, Tokenizer
from transformer_jax.evaluation import alignment
from transformer_jax.model.transformer import Transformer


def test_multi_piece_words_are_aligned_by_their_summed_attention():
  source_words = [0, 1, 1, 2]  # Ein | Fahr rad | fährt
  target_words = [0, 1, 1, 2]  # A | bi ke | rides
  attention = np.array([
      [0.7, 0.1, 0.1, 0.1],   # A -> Ein
      [0.45, 0.3, 0.25, 0.0],  # bi: Ein is its likeliest piece, Fahr + rad its likeliest word
      [0.1, 0.4, 0.4, 0.1],   # ke -> Fahrrad
      [0.1, 0.1, 0.1, 0.7]])  # rides -> fährt
  pairs = alignment.word_alignment(attention, source_words, target_words)
  assert pairs == [(0, 0), (1, 1), (2, 2)]
  assert alignment.pharaoh(pairs) == "0-0 1-1 2-2"
  assert alignment.word_alignment(attention[:0], source_words, []) == []


def _diagonal_model():
  """1+1 layers, sinusoidal positions, pre-LN RMSNorm, every weight 0 but the norms' scales and
  the cross-attention's query and key (c times the identity): the decoder's position t queries
  the encoder's position s by the sinusoids' product, largest at s == t, sharpened by c."""
  cfg = helpers.tiny_train_config(**{"model.num_encoder_layers": 1,
                                     "model.num_decoder_layers": 1,
                                     "model.positional_encoding": "sinusoidal",
                                     "model.norm": "rmsnorm", "model.pre_layer_norm": True})
  model = Transformer(cfg.model)
  dummy = np.ones((1, 8), np.int32)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy, dummy)["params"])
  D, H, K = cfg.model.d_model, cfg.model.num_heads, cfg.model.head_dim

  def value(path, leaf):
    names = [p.key for p in path]
    if names[-1] == "scale":
      return np.ones(leaf.shape, np.float32)
    if "cross_attention" in names and names[-2] in ("query", "key") and names[-1] == "kernel":
      return (30.0 * np.eye(D, dtype=np.float32)).reshape(D, H, K)
    return np.zeros(leaf.shape, np.float32)

  return model, jax.tree_util.tree_map_with_path(value, shapes)


def _align(model, params, tok, sentences, translations=None, tag=()):
  """Each sentence's alignment to `translations` (default: itself), given as the ids a search
  would have produced."""
  translations = sentences if translations is None else translations
  ids = [tok.encode(t, "target")[:-1] for t in translations]
  return alignment.align(model, params, tok, EvalSet.from_pairs(sentences, [], tok, tag), ids)


def test_a_model_whose_cross_attention_is_diagonal_aligns_each_word_to_itself(tiny_tokenizer):
  """A sentence 'translated' into itself, multi-piece words included: the diagonal, word for
  word."""
  model, params = _diagonal_model()
  tok = Tokenizer.load(tiny_tokenizer)
  sentence = "Zwei Skateboarder fahren nebeneinander die Rampe hinunter ."
  source = np.asarray(tok.encode(sentence), np.int32)
  assert len(tok.pieces(source[:-1])) > len(sentence.split())  # (multi-piece words)
  weights = alignment.cross_attention(model, params, [source], [source], layer=0)[0]
  assert (weights.argmax(axis=1) == np.arange(len(source))).all()  # (the pieces' diagonal)
  (line,) = _align(model, params, tok, [sentence])
  assert line == " ".join(f"{i}-{i}" for i in range(len(sentence.split())))


def test_a_line_longer_than_the_models_positions_leaves_the_others_as_they_are_alone(
    tiny_tokenizer):
  """Sources and targets are cut at max_len, as decoding cuts them: no position past the
  model's reaches a batch (whose NaN embedding spread to every row of it)."""
  model, params = _diagonal_model()
  tok = Tokenizer.load(tiny_tokenizer)
  long = " ".join(["sehr"] * 300)
  assert len(tok.encode(long)) > model.config.max_len
  short = [f"Ein Hund {'sehr ' * (i % 5)}rennt ." for i in range(63)]
  together = _align(model, params, tok, short[:31] + [long] + short[31:])
  assert together[:31] + together[32:] == [_align(model, params, tok, [s])[0] for s in short]
  assert together[0] == "0-0 1-1 2-2 3-3"
  assert {int(pair.split("-")[0]) for pair in together[31].split()} <= set(range(300))


def test_indices_are_the_whitespace_words_of_the_source_and_of_the_printed_translation(
    tiny_tokenizer, tmp_path):
  """Words as `split()` gives them, whatever the pieces: a normalised character (´ in don´t,
  an unknown piece here) and, with a paired tokenizer, a word whose first piece is not in the
  vocabulary (UNK). The translation's words are those of its printed text."""
  model, params = _diagonal_model()
  tok = Tokenizer.load(tiny_tokenizer)
  sentence = "Er sagt don´t mehr ."
  (line,) = _align(model, params, tok, [sentence])
  printed = tok.detokenize(tok.encode(sentence))  # "Er sagt don ⁇ t mehr ." (´ is unknown)
  pairs = [tuple(map(int, pair.split("-"))) for pair in line.split()]
  words, target_words = sentence.split(), printed.split()
  assert [j for _, j in pairs] == list(range(len(target_words)))
  assert all(0 <= i < len(words) for i, _ in pairs)
  assert [(words[i], target_words[j]) for i, j in pairs if target_words[j] in words] == [
      (w, w) for w in target_words if w in words]  # (Er, sagt, mehr, . to themselves)
  # A paired tokenizer (Marian's) whose vocabulary lacks the first piece of "Hund".
  sentence = "Ein Hund läuft durch den Schnee ."
  dropped = tok.encode_pieces(sentence)[1]
  assert dropped.startswith("\u2581")
  vocabulary = [p for p in tok.pieces(range(tok.vocab_size)) if p != dropped]
  paired = Tokenizer.from_bytes(PairedTokenizer.bundle(tok.model_proto, tok.model_proto,
                                                       vocabulary))
  assert UNK_ID in paired.encode(sentence)
  (line,) = _align(model, params, paired, [sentence])
  assert line == " ".join(f"{i}-{i}" for i in range(len(sentence.split())))
