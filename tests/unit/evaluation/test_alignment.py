"""Word alignments from the cross-attention: subwords mapped to words, a hand-made model whose
cross-attention is diagonal aligned on the diagonal, Pharaoh's format."""

import flax.linen as nn
import jax
import numpy as np

from tests import helpers
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.evaluation import alignment
from transformer_jax.model.transformer import Transformer


def test_pieces_map_to_the_words_they_spell():
  assert alignment.word_indices(["\u2581Ein", "\u2581Fahr", "rad", "\u2581", ".", "\u2581ja"]) \
      == [0, 1, 1, 2, 2, 3]
  assert alignment.word_indices(["rad", "\u2581x"]) == [0, 1]  # (a first piece: a word)


def test_multi_piece_words_are_aligned_by_their_summed_attention():
  source = ["\u2581Ein", "\u2581Fahr", "rad", "\u2581fährt"]  # words: Ein | Fahrrad | fährt
  target = ["\u2581A", "\u2581bi", "ke", "\u2581rides"]  # words: A | bike | rides
  attention = np.array([
      [0.7, 0.1, 0.1, 0.1],   # A -> Ein
      [0.45, 0.3, 0.25, 0.0],  # bi: Ein is its likeliest piece, Fahr + rad its likeliest word
      [0.1, 0.4, 0.4, 0.1],   # ke -> Fahrrad
      [0.1, 0.1, 0.1, 0.7]])  # rides -> fährt
  pairs = alignment.word_alignment(attention, source, target)
  assert pairs == [(0, 0), (1, 1), (2, 2)]
  assert alignment.pharaoh(pairs) == "0-0 1-1 2-2"
  assert alignment.word_alignment(attention[:0], source, []) == []


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
  (line,) = alignment.align(model, params, tok, EvalSet.from_pairs([sentence], [], tok),
                            [sentence])
  assert line == " ".join(f"{i}-{i}" for i in range(len(sentence.split())))
