"""`jaxpos train` on a translation config, then `translate` and `eval-bleu` on its workdir, through the CLI:
resume, empty and overlong input lines, BLEU consistent with the translations, and clear errors."""

import json
import os
import re

import pytest

from jaxpos.cli import main
from jaxpos.decoding import corpus_bleu
from jaxpos.positions import LengthError
from tests.helpers import folder_digest

pytestmark = pytest.mark.usefixtures("one_device_training")  # what runs write and read, not sharding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GERMAN = ["Haus", "Garten", "Baum", "Fluss", "Berg", "Stadt", "Straße", "Fenster"]
ENGLISH = ["house", "garden", "tree", "river", "mountain", "city", "road", "window"]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("translation")
    de = [f"das {a} und der {b}" for a in GERMAN for b in GERMAN]
    en = [f"the {a} and the {b}" for a in ENGLISH for b in ENGLISH]
    files = dict(train_source=write_lines(tmp / "train.de", de), train_target=write_lines(tmp / "train.en", en),
                 dev_source=write_lines(tmp / "dev.de", de[6:9]), dev_target=write_lines(tmp / "dev.en", en[6:9]),
                 test_source=write_lines(tmp / "test.de", de[:6]), test_target=write_lines(tmp / "test.en", en[:6]))
    workdir = str(tmp / "work")
    args = ["train", "--config", os.path.join(ROOT, "configs", "wmt", "tiny.py"), "--workdir", workdir,
            "--config.model.d_model=32", "--config.model.mlp_dim=64", "--config.model.num_layers=1",
            "--config.model.num_decoder_layers=1", "--config.model.max_length=24",
            "--config.data.source=files", "--config.data.vocab_size=60", "--config.data.max_length=24",
            "--config.data.eval_max_length=16", "--config.train.batch_size=8", "--config.train.log_every=2",
            "--config.train.eval_every=4", "--config.train.checkpoint_every=4", "--config.train.bleu_every=2",
            "--config.train.bleu_sentences=3", "--config.decode.batch_size=4", "--config.decode.target_width=16",
            "--config.model.position.kind=absolute"]
    args += [f"--config.data.{k}={v}" for k, v in files.items()]
    return tmp, workdir, args


def test_train_resume_translate_and_eval_bleu(run, capsys):
    tmp, workdir, args = run
    main(args + ["--config.train.num_steps=4", "--config.train.test_sentences=2"])
    assert json.load(open(os.path.join(workdir, "report.json")))["test_sentences"] == 2  # the final decode capped
    before = folder_digest(workdir)
    assert main(args + ["--config.train.num_steps=6", "--config.model.position.kind=sinusoidal"]) == 2
    assert "was saved for another model" in capsys.readouterr().err
    assert folder_digest(workdir) == before  # a refused resume leaves the run as it was
    main(args + ["--config.train.num_steps=6"])
    out = capsys.readouterr()
    assert "resumed from checkpoint step 4" in out.out + out.err
    report = json.load(open(os.path.join(workdir, "report.json")))
    assert report["step"] == 6 and report["test_sentences"] == 6 and 0.0 <= report["test_bleu"] <= 100.0
    assert report["dev"]["loss"] > 0 and 0.0 <= report["dev"]["bleu"] <= 100.0  # dev BLEU at the last step
    hypotheses = open(os.path.join(workdir, "test_translations.txt"), encoding="utf-8").read().splitlines()
    assert len(hypotheses) == 6

    lines = ["das Haus und der Baum", "", "   ", " ".join(["das Haus"] * 30)]  # empty, blank, overlong
    source = write_lines(tmp / "input.de", lines)
    target = str(tmp / "output.en")
    main(["translate", "--workdir", workdir, "--input", source, "--output", target])
    err = capsys.readouterr().err
    assert "1 line(s) are longer than 15 tokens and were cut" in err
    outputs = open(target, encoding="utf-8").read().split("\n")[:-1]
    assert len(outputs) == 4 and outputs[1] == "" and outputs[2] == ""

    main(["eval-bleu", "--workdir", workdir])
    printed = capsys.readouterr().out
    score = float(re.search(r"SacreBLEU ([0-9.]+)", printed).group(1))
    assert "signature: nrefs:1|case:mixed" in printed and "copying the source" in printed
    references = open(tmp / "test.en", encoding="utf-8").read().splitlines()
    assert score == pytest.approx(corpus_bleu(hypotheses, references).score, abs=0.01)  # same checkpoint
    with pytest.raises(ValueError, match="unknown config field decode.beams"):
        main(["--debug", "translate", "--workdir", workdir, "--config.decode.beams=3"])


def test_clear_errors(run, tmp_path):
    _, _, args = run
    args = ["--debug", *args]  # the errors themselves (without --debug each is one line: tests/cli/test_main.py)
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        main(["--debug", "eval-bleu", "--workdir", str(tmp_path)])
    with pytest.raises(LengthError, match="'absolute' has learned parameters for 24 positions .* length 32"):
        main(args[:5] + [str(tmp_path / "w")] + args[6:] + ["--config.data.eval_max_length=32"])
    assert not os.path.exists(tmp_path / "w" / "checkpoints")  # raised at start-up, before any training
