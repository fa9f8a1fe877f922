"""The TFDS translation source without TensorFlow: a tiny de-en dataset prepared as array_record here."""

import pytest

pytest.importorskip("array_record", reason="TFDS data sources need the array_record package")
tfds = pytest.importorskip("tensorflow_datasets")

from jaxpos.data.parallel import TranslationStats, tfds_pairs  # noqa: E402
from jaxpos.data.translation import build_translation_data  # noqa: E402
from jaxpos.config.data import default_translation_data_config

GERMAN = ["ein Haus", "zwei Häuser", "ein roter Hund", "der Hund schläft", "die Katze", "drei Katzen"]
ENGLISH = ["a house", "two houses", "a red dog", "the dog sleeps", "the cat", "three cats"]


class JaxposTranslationTiny(tfds.core.GeneratorBasedBuilder):
    """40 training pairs (one with an empty side), 6 validation and 6 test pairs, as wmt*_translate has them."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=("de", "en")))

    def _split_generators(self, dl_manager):
        train = [(GERMAN[i % 6] + f" {i}", ENGLISH[i % 6] + f" {i}") for i in range(40)]
        train[7] = ("", "an empty source")
        held_out = list(zip(GERMAN, ENGLISH))
        return {"train": self._generate_examples(train), "validation": self._generate_examples(held_out),
                "test": self._generate_examples(held_out[::-1])}

    def _generate_examples(self, pairs):
        for i, (de, en) in enumerate(pairs):
            yield i, {"de": de, "en": en}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tfds_translation"))
    JaxposTranslationTiny(data_dir=directory, file_format="array_record").download_and_prepare()
    return directory


def test_pairs_in_both_directions(data_dir):
    stats = TranslationStats()
    de_en = tfds_pairs("jaxpos_translation_tiny", "train", data_dir, "de", "en", stats)
    assert len(de_en) == 39 and stats.skipped_empty == 1
    pairs = dict(zip(de_en.sources, de_en.targets))
    assert pairs["ein roter Hund 2"] == "a red dog 2" and pairs["die Katze 16"] == "the cat 16"
    en_de = tfds_pairs("jaxpos_translation_tiny", "train", data_dir, "en", "de", TranslationStats())
    assert dict(zip(en_de.sources, en_de.targets))["a red dog 2"] == "ein roter Hund 2"
    assert len(tfds_pairs("jaxpos_translation_tiny", "train[:50%]", data_dir, "de", "en", TranslationStats())) == 20
    assert len(tfds_pairs("jaxpos_translation_tiny", "train", data_dir, "de", "en", TranslationStats(),
                          max_pairs=5)) == 5
    with pytest.raises(KeyError, match=r"no language 'fr' .*its records have \['de', 'en'\]"):
        tfds_pairs("jaxpos_translation_tiny", "test", data_dir, "fr", "en", TranslationStats())


def test_translation_data_from_tfds(data_dir, tmp_path):
    config = default_translation_data_config()
    config.update(source="tfds", tfds_name="jaxpos_translation_tiny", data_dir=data_dir, source_lang="en",
                  target_lang="de", vocab_size=60, max_length=32, eval_max_length=24)
    data = build_translation_data(config, 2, str(tmp_path), process_index=0, process_count=1)
    train = data.stats["train"]
    assert train.pairs == 39 and train.skipped_empty == 1 and not train.dropped_long
    # TFDS stores records in an order of its own (hashed keys): compare the pairs, not the order
    assert dict(zip(data.dev.sources, data.dev.references)) == dict(zip(ENGLISH, GERMAN))
    assert sorted(data.test.sources) == sorted(ENGLISH) and data.dev.inputs.shape == (6, 24)
    batch = next(data.train)
    assert batch["inputs"].shape == (2, 32) and batch["target_piece_ids"].max() >= 1
