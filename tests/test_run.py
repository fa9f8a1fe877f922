"""`jaxpos.run.Run`: a trained workdir read in one place (config, task, tokenizer, checkpoint steps, parameters at a
step on any placement), checked against what training wrote; then the same runs at a gs:// URL (a fake bucket in a
local folder: tests/helpers.py's `fake_gcs`), read by every command that reads runs: analyze, finetune --init,
export and translate."""

import json
import os
import pathlib
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from jaxpos.cli import main
from jaxpos.config import model_config
from jaxpos.config.defaults import finetune_config
from jaxpos.data.tokenizer import MLM_SPECIAL_TOKENS, TRANSLATION_SPECIAL_TOKENS, load_tokenizer
from jaxpos.run import Run
from jaxpos.sharding import logical_sharding, make_mesh
from tests.helpers import fake_gcs, train_tiny_mlm

pytestmark = pytest.mark.usefixtures("one_device_training")  # what runs write and read, not sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLM_URL, TRANSLATION_URL = "gs://bucket/runs/tiny_mlm", "gs://bucket/runs/tiny_translation"
GERMAN = ["Haus", "Garten", "Baum", "Fluss", "Berg", "Stadt", "Straße", "Fenster"]
ENGLISH = ["house", "garden", "tree", "river", "mountain", "city", "road", "window"]
SENTENCE = "The house stands in the garden."


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    """A masked-LM run trained for two steps, checkpointed after each."""
    return train_tiny_mlm(str(tmp_path_factory.mktemp("run") / "tiny_mlm"), checkpoint_every=1)


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory):
    """An encoder-decoder trained by `jaxpos train` for two steps on 64 pairs (no dev or test set)."""
    tmp = tmp_path_factory.mktemp("translation")
    for name, lines in (("train.de", [f"das {a} und der {b}" for a in GERMAN for b in GERMAN]),
                        ("train.en", [f"the {a} and the {b}" for a in ENGLISH for b in ENGLISH])):
        (tmp / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    workdir = str(tmp / "tiny_translation")
    main(["train", "--config", os.path.join(ROOT, "configs", "wmt", "tiny.py"), "--workdir", workdir,
          "--config.model.d_model=32", "--config.model.mlp_dim=64", "--config.model.num_layers=1",
          "--config.model.num_decoder_layers=1", "--config.model.max_length=24",
          "--config.model.position.kind=absolute", "--config.data.source=files",
          f"--config.data.train_source={tmp / 'train.de'}", f"--config.data.train_target={tmp / 'train.en'}",
          "--config.data.vocab_size=60", "--config.data.max_length=24", "--config.data.eval_max_length=16",
          "--config.train.batch_size=8", "--config.train.num_steps=2", "--config.train.log_every=1",
          "--config.train.checkpoint_every=2", "--config.decode.target_width=16", "--config.decode.beam_size=2"])
    return workdir


@pytest.fixture(scope="module")
def bucket(mlm_run, translation_run, tmp_path_factory):
    """A folder standing for gs://bucket, holding copies of both runs under runs/."""
    root = tmp_path_factory.mktemp("gcs")
    for workdir, url in ((mlm_run, MLM_URL), (translation_run, TRANSLATION_URL)):
        shutil.copytree(workdir, root / url[len("gs://"):])
    return root


def written_params(workdir: str, step: int) -> dict:
    """The parameters of checkpoint `step` as training wrote them, read by orbax without a target (numpy)."""
    path = os.path.join(os.path.abspath(workdir), "checkpoints", str(step), "state")
    with ocp.PyTreeCheckpointer() as checkpointer:
        saved = checkpointer.metadata(path).item_metadata.tree
        state = checkpointer.restore(path, restore_args=jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved))
    return state["params"]


def assert_same_tree(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def listing(folder) -> dict:
    return {os.path.relpath(os.path.join(d, f), folder): os.path.getmtime(os.path.join(d, f))
            for d, _, files in os.walk(folder) for f in files}


def test_a_masked_lm_run_reads_as_written(mlm_run):
    before = listing(mlm_run)
    run = Run.open(mlm_run)
    saved = json.loads(open(os.path.join(mlm_run, "config.json")).read())
    assert run.config.to_dict() == saved and run.task == "mlm" == saved["task"]
    assert run.model_config == model_config(saved["model"]) and run.num_labels is None
    assert (run.location, run.name) == (os.path.abspath(mlm_run), "tiny_mlm")
    assert Run.open(mlm_run, "mlm").config.to_dict() == saved
    with pytest.raises(ValueError, match="a 'mlm' run; this command reads 'translation' runs"):
        Run.open(mlm_run, "translation")
    assert Run.open(mlm_run, overrides=["--config.data.seq_len=16"]).config.data.seq_len == 16

    assert run.tokenizer_file == epath.Path(mlm_run) / "spm_mlm.model"
    tokenizer = run.tokenizer()
    assert tokenizer.special_tokens == MLM_SPECIAL_TOKENS and tokenizer.vocab_size == run.model_config.vocab_size
    assert tokenizer.encode(SENTENCE) == load_tokenizer(os.path.join(mlm_run, "spm_mlm.model")).encode(SENTENCE)

    assert run.steps() == [1, 2]
    step, params = run.params()
    assert step == 2
    assert_same_tree(jax.device_get(params), written_params(mlm_run, 2))
    assert {x.sharding for x in jax.tree.leaves(params)} == {jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])}
    first = run.params(1)
    assert first[0] == 1
    assert_same_tree(jax.device_get(first[1]), written_params(mlm_run, 1))
    assert not np.array_equal(first[1]["bert"]["token_embed"]["embedding"], params["bert"]["token_embed"]["embedding"])

    mesh = make_mesh(data=2, fsdp=2, tensor=2)  # the 8 simulated CPU devices of conftest.py
    step, sharded = run.params(on=mesh)
    module, init_args = run.module()
    boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *init_args))["params"]
    jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(f"{x.sharding} != {s}"),
                 sharded, logical_sharding(boxed, mesh))
    assert_same_tree(jax.device_get(sharded), written_params(mlm_run, 2))
    with pytest.raises(ValueError, match=r"has no checkpoint of step 7 \(it has 1, 2\)"):
        run.params(7)
    assert listing(mlm_run) == before  # only read


def test_a_fine_tuned_run_names_its_encoders_tokenizer(mlm_run, tmp_path):
    """Task and tokenizer as `jaxpos finetune` records them: config.task and config.init (config.json only)."""
    config = finetune_config()
    config.data.task = "stsb"
    config.model = Run.open(mlm_run).config.to_dict()["model"]
    config.init = dict(kind="jaxpos", path=os.path.abspath(mlm_run),
                       tokenizer=os.path.join(mlm_run, "spm_mlm.model"), step=2)
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    run = Run.open(tmp_path, "finetune")
    assert (run.task, run.num_labels) == ("finetune", 1)
    assert run.tokenizer_file == epath.Path(mlm_run) / "spm_mlm.model"
    assert run.tokenizer().encode(SENTENCE) == Run.open(mlm_run).tokenizer().encode(SENTENCE)


def test_a_translation_run_reads_as_written(translation_run):
    run = Run.open(translation_run, "translation")
    assert run.task == "translation" and run.model_config.num_decoder_layers == 1
    assert run.tokenizer_file == epath.Path(translation_run) / "spm_translation.model"
    assert run.tokenizer().special_tokens == TRANSLATION_SPECIAL_TOKENS
    assert run.steps() == [2]
    step, params = run.params()
    assert step == 2
    assert_same_tree(jax.device_get(params), written_params(translation_run, 2))


def test_runs_at_a_url_read_as_local_ones(mlm_run, translation_run, bucket):
    local = Run.open(mlm_run)
    with fake_gcs(bucket):
        run = Run.open(MLM_URL, "mlm")
        assert run.config.to_dict() == local.config.to_dict() and run.task == "mlm"
        assert (run.location, run.name) == (MLM_URL, "tiny_mlm")
        assert os.fspath(run.tokenizer_file) == MLM_URL + "/spm_mlm.model"
        assert run.tokenizer().encode(SENTENCE) == local.tokenizer().encode(SENTENCE)
        assert run.steps() == [1, 2]
        for step in (None, 1):
            remote, params = run.params(step)
            assert remote == (step or 2)
            assert_same_tree(jax.device_get(params), jax.device_get(local.params(step)[1]))
        translation = Run.open(TRANSLATION_URL)
        assert translation.task == "translation" and translation.steps() == [2]


def test_analyze_finetune_export_and_translate_read_a_url(mlm_run, translation_run, bucket, tmp_path):
    from jaxpos.analysis.loading import load_run
    from jaxpos.checkpoints import export_run, load_export, read_export_config
    from jaxpos.workflows.finetune import load_pretrained
    from jaxpos.workflows.translation import load_translator

    local_model, local_encoder = load_run(mlm_run), load_pretrained(mlm_run)
    local_translator, _, _ = load_translator(translation_run)
    with fake_gcs(bucket):
        model = load_run(MLM_URL)  # jaxpos analyze
        assert (model.name, model.source, model.info["step"]) == ("tiny_mlm", MLM_URL, 2)
        assert model.info["tokenizer"] == MLM_URL + "/spm_mlm.model" and model.cfg == local_model.cfg
        assert model.vocabulary == local_model.vocabulary and model.encode(SENTENCE) == local_model.encode(SENTENCE)
        assert_same_tree(model.params, local_model.params)
        out = tmp_path / "analysis"
        assert main(["analyze", "--workdir", MLM_URL, "--out", str(out), "--quick", "--only", "rank",
                     "--checkpoints", "all"]) == 0
        assert json.loads((out / "over_training.json").read_text())["steps"] == [1, 2]

        pretrained = load_pretrained(MLM_URL)  # jaxpos finetune --init
        assert pretrained.info == dict(local_encoder.info, path=MLM_URL, tokenizer=MLM_URL + "/spm_mlm.model")
        assert pretrained.cfg == local_encoder.cfg and pretrained.tokenizer.source == MLM_URL + "/spm_mlm.model"
        assert pretrained.tokenizer.encode(SENTENCE) == local_encoder.tokenizer.encode(SENTENCE)
        assert_same_tree(pretrained.encoder, local_encoder.encoder)
        finetuned = str(tmp_path / "finetuned")
        main(["finetune", "--config", os.path.join(ROOT, "configs", "finetune", "tiny.py"), "--init", MLM_URL,
              "--workdir", finetuned, "--config.data.max_length=32", "--config.train.num_steps=1",
              "--config.train.batch_size=8", "--config.train.log_every=1"])
        assert Run.open(finetuned, "finetune").config.init["path"] == MLM_URL
        main(["evaluate", "--workdir", finetuned])  # reads the tokenizer at the URL again

        done = export_run(MLM_URL, str(tmp_path / "export"), step=1)  # jaxpos export
        assert (done["task"], done["step"], read_export_config(done["out"])["source"]) == ("mlm", 1, MLM_URL)
        assert (tmp_path / "export" / "spm_mlm.model").read_bytes() == \
            (epath.Path(mlm_run) / "spm_mlm.model").read_bytes()

        translator, config, step = load_translator(TRANSLATION_URL)  # jaxpos translate / eval-bleu
        assert step == 2 and config.to_dict() == Run.open(translation_run).config.to_dict()
        assert translator.tokenizer.encode("das Haus") == local_translator.tokenizer.encode("das Haus")
        assert_same_tree(jax.device_get(translator.params), jax.device_get(local_translator.params))
    _, params = load_export(str(tmp_path / "export"))
    assert_same_tree(jax.device_get(params), written_params(mlm_run, 1))


def test_training_a_finished_run_again_keeps_its_report(mlm_run, tmp_path):
    """`jaxpos train` on a run already at its last step trains and evaluates nothing: report.json keeps the train
    and held-out metrics it was written with."""
    again = str(tmp_path / "again")
    shutil.copytree(mlm_run, again)
    before = json.loads((pathlib.Path(again) / "report.json").read_text())
    assert before["train"] and before["eval"] and before["step"] == 2
    train_tiny_mlm(again, checkpoint_every=1)
    assert json.loads((pathlib.Path(again) / "report.json").read_text()) == before
