"""A run's decoding settings as CTranslate2's translate_batch arguments, the differences named,
and translating with an exported folder keeping empty lines and a source tag."""

from tests import helpers
from transformer_jax.interop import ctranslate2_decoding as decoding


def test_beam_greedy_and_sampling_settings_become_translate_batch_arguments():
  """Each option as its declaration maps it: greedy and sampling with CTranslate2's length
  penalty off (their scores total log-probabilities, as ours), the repetition options as
  CTranslate2's own keywords."""
  beam = helpers.section("decode", beam_size=5, nbest=3, length_penalty=1.0, max_length=300,
                         min_length=2, no_repeat_ngram_size=3, repetition_penalty=1.2)
  assert decoding.translate_options(beam, max_len=256) == dict(
      max_input_length=256, max_decoding_length=256, min_decoding_length=2, beam_size=5,
      length_penalty=1.0, num_hypotheses=3, return_scores=True, max_batch_size=32,
      no_repeat_ngram_size=3, repetition_penalty=1.2)
  greedy = decoding.translate_options(helpers.section("decode", greedy=True), 256)
  assert {k: greedy[k] for k in ("beam_size", "sampling_topk", "length_penalty",
                                 "num_hypotheses")} == dict(
      beam_size=1, sampling_topk=1, length_penalty=0.0, num_hypotheses=1)
  sampled = decoding.translate_options(
      helpers.section("decode", sampling=True, top_k=10, top_p=0.9, temperature=0.7,
                      mbr="chrf", mbr_candidates=8), 256)
  assert {k: sampled[k] for k in ("beam_size", "sampling_topk", "sampling_topp",
                                  "sampling_temperature", "num_hypotheses",
                                  "length_penalty")} == dict(
      beam_size=1, sampling_topk=10, sampling_topp=0.9, sampling_temperature=0.7,
      num_hypotheses=8, length_penalty=0.0)


def test_what_ctranslate2_does_differently_is_said():
  decode = helpers.section("decode", length_penalty=0.6, max_length_a=1.5, max_length_b=10,
                           mbr="chrf", mbr_candidates=2)
  notes = decoding.differences(decode)
  assert [note.split(":")[0] for note in notes] == [
      "length_penalty=0.6", "max_length_a=1.5, max_length_b=10", "mbr='chrf'"]
  # (the engine does the caps and MBR itself: the length penalty's formula is what is left)
  assert decoding.differences(decode, around_the_call=True) == notes[:1]
  assert decoding.differences(helpers.section("decode", greedy=True, max_length_a=0.0,
                                              max_length_b=32, max_length=32)) == []
