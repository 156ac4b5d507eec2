"""One model for two directions (de->en and en->de, target-language tags on the source):
it trains on both, validates and tests each, `evaluate` scores each in one call, and the
server translates into the language a request names."""

import gzip
import itertools

import ml_collections
import numpy as np
import pytest

from tests import helpers
from transformer_jax.config.parse import from_config_dict
from transformer_jax.data import corpus
from transformer_jax.data.eval_sets import scoring_sets
from transformer_jax.data.plan import data_plan
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import ConfigError
from transformer_jax.inference.checkpoint_eval import evaluate_checkpoints
from transformer_jax.inference.translator import Translator
from transformer_jax.interop.engines import ctranslate2_translator
from transformer_jax.serving.service import Options, Service
from transformer_jax.training.loop import train_and_evaluate

TAGS = {"deen": ">>en<<", "ende": ">>de<<"}


@pytest.fixture(scope="module")
def bilingual(tmp_path_factory):
  """A trained two-direction run (10 steps) and its config."""
  tmp = tmp_path_factory.mktemp("multilingual")
  folder = tmp / "corpus"
  folder.mkdir()
  for split, start, count in (("train", 0, 3000), ("test", 3000, 12)):
    for lang in ("de", "en"):
      lines = itertools.islice(corpus.read_lines(corpus.EMBEDDED_MULTI30K / f"train.{lang}.gz"),
                               start, start + count)
      (folder / f"{split}.{lang}.gz").write_bytes(
          gzip.compress("".join(x + "\n" for x in lines).encode()))
  c = helpers.tiny_config(**{**helpers.ONE_LAYER, "data.cache_dir": str(tmp / "tfds"),
                             "data.data_dir": str(folder), "data.eval_split": "test",
                             "num_train_steps": 10, "eval_every_steps": 10,
                             "checkpoint_every_steps": 10})
  c.data.corpora = ml_collections.ConfigDict({
      "deen": dict(tag=TAGS["deen"], eval_split="test", test_split="test"),
      "ende": dict(source_lang="en", target_lang="de", tag=TAGS["ende"], test_split="test")})
  final = train_and_evaluate(from_config_dict(c), tmp / "run", c.to_dict())
  return tmp / "run", from_config_dict(c), final, folder


def test_each_direction_is_drawn_half_the_time_and_tested_with_its_tag(bilingual):
  workdir, cfg, final, folder = bilingual
  records = helpers.read_metrics(workdir)
  shares = [r for r in records if "data/corpus/deen/share" in r][-1]
  assert shares["data/corpus/deen/share"] == pytest.approx(0.5, abs=0.01)
  assert shares["data/corpus/ende/share"] == pytest.approx(0.5, abs=0.01)
  for key in ("eval/bleu", "eval/deen.test/bleu", "test/deen.test/bleu", "test/ende.test/bleu"):
    assert np.isfinite(final[key]), key
  tok = Tokenizer.load(workdir / "spm.model")
  sets = scoring_sets(data_plan(cfg.data), tok)
  assert list(sets) == ["deen.test", "ende.test"]
  german = list(corpus.read_lines(folder / "test.de.gz"))
  assert sets["ende.test"].references == german and sets["deen.test"].sources == german
  for name, eval_set in sets.items():  # (each source after its direction's tag, a piece)
    tag_id = tok.tag_id(TAGS[name.split(".")[0]], name)
    assert all(ids[0] == tag_id and tag_id not in ids[1:] for ids in eval_set.source_ids)
  # validation of the main set and of the tagged de->en set: the same pairs, but only the
  # latter has the tag the model was trained with
  assert final["eval/bleu"] != final["eval/deen.test/bleu"] or \
      final["eval/loss"] != final["eval/deen.test/loss"]


def test_evaluate_scores_every_direction_in_one_call_as_training_did(bilingual):
  workdir, _, final, _ = bilingual
  results, out_dirs = evaluate_checkpoints(workdir, checkpoint="latest", alignments=True)
  assert [r["data"] for r in results] == ["deen.test", "ende.test"]
  assert [d.name for d in out_dirs] == ["deen.test", "ende.test"]
  for r, out_dir in zip(results, out_dirs):
    assert r["bleu"] == pytest.approx(final[f"test/{r['data']}/bleu"], abs=1e-9)
    assert r["chrf"] == pytest.approx(final[f"test/{r['data']}/chrf"], abs=1e-9)
    # Word alignments beside the translations, the direction's tag not counted as a word.
    hyps = (out_dir / f"{r['label']}.hyp").read_text().splitlines()
    links = (out_dir / f"{r['label']}.align").read_text().splitlines()
    assert len(links) == len(hyps)
    assert all([int(p.split("-")[1]) for p in line.split()] == list(range(len(hyp.split())))
               for line, hyp in zip(links, hyps))


def test_the_server_translates_into_the_target_a_request_names(bilingual):
  """Served without --source_tag, the two-direction run offers both languages; a request's
  `target` puts its tag before the source: the translations, scores and alignments (word
  indices of the text sent) of `translate --source_tag`."""
  workdir = bilingual[0]
  engine = Service(Translator(str(workdir), alignments=True))
  assert (engine.sources, engine.targets) == (["de", "en"], ["de", "en"])
  for target, sentence in (("en", "Ein Hund läuft im Schnee."), ("de", "A dog runs.")):
    tagged = Translator(str(workdir), source_tag=TAGS["ende" if target == "de" else "deen"],
                        alignments=True)
    (hyps,) = tagged.translate([sentence])
    (served,) = engine.translate([sentence], [""], Options(target=target, alignments=True))
    assert served.hypotheses == [{"translation": hyps[0].text, "score": float(hyps[0].score),
                                  "alignment": tagged.alignments([sentence], hyps[:1])[0]}]
  with pytest.raises(ConfigError, match=r"target language 'fr' is not served \(this model: "
                                        r"de/en -> de, en\)"):
    engine.check_target("fr")


def test_the_ctranslate2_engine_reads_the_target_tag_as_our_search_does(bilingual, tmp_path,
                                                                        monkeypatch):
  """With CTranslate2 the tag a request's target puts before the source is one piece, as
  training and our search see it: CTranslate2 is given the pieces of our search's ids, and
  its greedy translations into each language equal ours."""
  pytest.importorskip("ctranslate2")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  workdir = bilingual[0]
  greedy = ["greedy=true", "max_length=12", "max_length_a=0", "max_length_b=12"]
  ours = Service(Translator(str(workdir), decode_overrides=greedy))
  translator = ctranslate2_translator(str(workdir), decode_overrides=greedy,
                                      requested_type="float32")
  given = []

  class Spy:  # (what CTranslate2 is given)
    def __init__(self, inner):
      self.inner = inner

    def translate_batch(self, tokens, **options):
      given.extend(tokens)
      return self.inner.translate_batch(tokens, **options)

  translator.warm_up()  # (untagged: made up, not refused as a user's line would be)
  translator.engine.backend = Spy(translator.engine.backend)
  theirs, tokenizer = Service(translator), translator.run.tokenizer
  sentences = ["Ein Hund läuft im Schnee.", "Zwei Männer sitzen.", "A dog runs.", ""]
  for target in ("en", "de"):
    given.clear()
    texts = [[[h["translation"] for h in answer.hypotheses]
              for answer in engine.translate(sentences, [""] * 4, Options(target=target))]
             for engine in (ours, theirs)]
    assert texts[0] == texts[1] and texts[0][3] == [], (target, texts)
    assert given == [tokenizer.pieces(tokenizer.encode(f">>{target}<< {s}")[:-1])
                     for s in sentences[:3]]
    assert all(tokens[0] == f">>{target}<<" for tokens in given)
  with pytest.raises(ConfigError, match="seed: not with the ctranslate2 engine"):
    theirs.decode_config(Options(seed=1))
