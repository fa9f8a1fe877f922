"""`jaxpos export`: parameters only, as an orbax export restored by `load_export` onto one device or a mesh, and
as a Hugging Face folder that transformers loads to the same logits and that the importer reads back exactly."""

import dataclasses
import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos import cli
from jaxpos.checkpoints import load_export, read_export_config
from jaxpos.checkpoints.export import cast_params, export_run, hf_config, save_export, save_huggingface
from jaxpos.config import model_config
from jaxpos.config.defaults import mlm_config
from jaxpos.models import BertForMaskedLM
from jaxpos.sharding import logical_sharding, make_mesh
from jaxpos.training.checkpoint import Checkpointer
from jaxpos.training.loop import model_config_dict
from jaxpos.training.optim import make_optimizer
from jaxpos.training.state import init_state

TINY_MODEL = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16, dropout=0.0,
                  attention_dropout=0.0)


def perturbed(tree, seed: int):
    """Every leaf moved off its initial value (zero biases, unit scales), so each mapped tensor matters."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return treedef.unflatten([x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def save_run(workdir, position: dict, steps=(1, 2), **model) -> dict:
    """A masked-LM workdir as `jaxpos train` leaves it (config.json, orbax TrainStates with Adam moments, the
    model config item); returns {step: params} as numpy."""
    os.makedirs(workdir, exist_ok=True)
    config = mlm_config()
    config.model.update(TINY_MODEL, **model)
    config.model.position.update(position)
    config.data.seq_len = 16
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))
    module = BertForMaskedLM(model_config(config.model))
    ids = jnp.zeros((1, 16), jnp.int32)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    saved = {}
    for step in steps:
        state = nn.unbox(init_state(module, make_optimizer(config.train), jax.random.PRNGKey(step), (ids,), {}))
        # Adam's moments as after training (random, so that they do not compress away as zeros would).
        moments = jax.tree.map(lambda x: jnp.abs(perturbed(x, step + 100)) if jnp.issubdtype(x.dtype, jnp.floating)
                               else x, state.opt_state)
        state = state.replace(step=jnp.asarray(step, jnp.int32), params=perturbed(state.params, step),
                              opt_state=moments)
        checkpointer.save(step, state, {"position": step}, model_config_dict(module))
        saved[step] = jax.tree.map(np.asarray, state.params)
    checkpointer.close()
    return saved


def folder_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.fixture(scope="module")
def tisa_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tisa_run")
    return str(workdir), save_run(str(workdir), dict(kind="tisa"))


def test_orbax_export_restores_the_newest_parameters_without_optimizer_state(tisa_run, tmp_path):
    workdir, saved = tisa_run
    out = tmp_path / "export"
    done = export_run(workdir, str(out))
    assert done == dict(out=str(out), format="orbax", task="mlm", step=2, dtype="float32")
    cfg, params = load_export(str(out))
    assert cfg == model_config(json.loads((tmp_path / "export" / "run_config.json").read_text())["model"])
    jax.tree.map(np.testing.assert_array_equal, params, saved[2])
    assert {x.sharding for x in jax.tree.leaves(params)} == {jax.sharding.SingleDeviceSharding(jax.devices()[0])}
    meta = read_export_config(str(out))
    assert (meta["task"], meta["step"], meta["source"]) == ("mlm", 2, os.path.abspath(workdir))
    # Adam's two moments make a training checkpoint about three times the parameters (plus orbax's metadata).
    assert folder_bytes(out / "params") < 0.5 * folder_bytes(os.path.join(workdir, "checkpoints", "2"))


def test_bfloat16_export_of_a_given_step(tisa_run, tmp_path):
    workdir, saved = tisa_run
    out = str(tmp_path / "bf16")
    export_run(workdir, out, dtype="bfloat16", step=1)
    cfg, params = load_export(out)
    assert cfg.param_dtype == "bfloat16" and read_export_config(out)["step"] == 1
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    jax.tree.map(np.testing.assert_array_equal, params, cast_params(saved[1], "bfloat16"))
    logits = BertForMaskedLM(cfg).apply({"params": params}, jnp.ones((2, 16), jnp.int32))
    assert logits.shape == (2, 16, 64) and np.isfinite(np.asarray(logits)).all()


def test_mixed_dtypes_are_kept(tisa_run, tmp_path):
    """param_dtype=bfloat16 leaves TISA's kernels in float32: an export without --dtype keeps both."""
    workdir, saved = tisa_run
    cfg = dataclasses.replace(read_config(workdir), param_dtype="bfloat16")
    module = BertForMaskedLM(cfg)
    abstract = nn.unbox(jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32))))
    mixed = jax.tree.map(lambda x, a: x.astype(a.dtype), saved[2], abstract["params"])
    assert len({x.dtype for x in jax.tree.leaves(mixed)}) == 2
    save_export(str(tmp_path), cfg, mixed)
    loaded_cfg, params = load_export(str(tmp_path))
    assert loaded_cfg == cfg and read_export_config(str(tmp_path))["dtype"] is None
    jax.tree.map(lambda x, y: x.dtype == y.dtype or pytest.fail(f"{x.dtype} != {y.dtype}"), params, mixed)
    jax.tree.map(np.testing.assert_array_equal, params, mixed)


def read_config(workdir):
    return model_config(json.loads(open(os.path.join(workdir, "config.json")).read())["model"])


def test_load_export_places_parameters_on_a_mesh_by_the_logical_rules(tisa_run, tmp_path):
    workdir, saved = tisa_run
    out = str(tmp_path / "export")
    export_run(workdir, out)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)  # the 8 simulated CPU devices of conftest.py
    cfg, params = load_export(out, mesh=mesh)
    module = BertForMaskedLM(cfg)
    boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32)))["params"]
    jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(f"{x.sharding} != {s}"),
                 params, logical_sharding(boxed, mesh))
    embedding = params["bert"]["token_embed"]["embedding"]  # ("vocab", "embed") -> ("tensor", "fsdp")
    assert not embedding.sharding.is_fully_replicated and len(embedding.addressable_shards) == 8
    jax.tree.map(np.testing.assert_array_equal, params, saved[2])


def test_export_errors_name_the_problem(tisa_run, tmp_path):
    workdir, _ = tisa_run
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_run(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"has no checkpoint of step 7 \(it has 1, 2\)"):
        export_run(workdir, str(tmp_path / "out"), step=7)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="already exists and is not empty"):
        export_run(workdir, str(tmp_path / "full"))
    with pytest.raises(ValueError, match="--dtype 'int8'"):
        export_run(workdir, str(tmp_path / "out"), dtype="int8")
    with pytest.raises(ValueError, match=r"position.kind='tisa': BERT and ALBERT have learned absolute"):
        export_run(workdir, str(tmp_path / "hf"), format="huggingface")
    assert not (tmp_path / "hf").exists()  # refused before anything was read or written
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_export(str(tmp_path / "full"))
    export_run(workdir, str(tmp_path / "e"))
    with pytest.raises(ValueError, match=r"mesh axes \('x',\)"):
        load_export(str(tmp_path / "e"), mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("x",)))


def test_cli_export_and_its_one_line_error(tisa_run, tmp_path, capsys):
    workdir, _ = tisa_run
    assert cli.main(["export", "--workdir", workdir, "--out", str(tmp_path / "e"), "--step", "1"]) == 0
    assert f"exported step 1 of {workdir} (mlm, float32) as orbax" in capsys.readouterr().out
    assert cli.main(["export", "--workdir", workdir, "--out", str(tmp_path / "h"), "--format", "huggingface"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("jaxpos: error: the Hugging Face format cannot express "
                                               "model.position.kind='tisa'"), err


# --- Hugging Face ----------------------------------------------------------------------------------------------------

HF_VARIANTS = {
    "bert": dict(),
    "bert_untied_gelu_tanh": dict(tie_embeddings=False, activation="gelu_tanh"),
    "bert_without_token_types": dict(position=dict(kind="absolute", segment="none")),
    "albert": dict(share_layers=True, embedding_dim=16, activation="gelu_tanh"),
}


def hf_inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 64, size=(3, 13))
    attention = np.ones_like(ids)
    attention[1, 9:] = 0
    types = (np.arange(13)[None, :] >= 6).astype(np.int64).repeat(3, 0)
    return ids, attention, types


def perturbed_mlm_params(cfg, seed=0):
    params = BertForMaskedLM(cfg).init(jax.random.PRNGKey(seed), jnp.zeros((1, 16), jnp.int32))["params"]
    return jax.tree.map(np.asarray, perturbed(nn.unbox(params), seed + 1))


@pytest.mark.parametrize("variant", list(HF_VARIANTS))
def test_huggingface_export_gives_transformers_the_same_logits_and_imports_back(variant, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from jaxpos.checkpoints.huggingface import bert_mlm_params, config_from_hf, load_hf_checkpoint

    values = dict(TINY_MODEL, position=dict(kind="absolute"))
    values.update(HF_VARIANTS[variant])
    cfg = model_config(values)
    params = perturbed_mlm_params(cfg)
    save_huggingface(str(tmp_path), cfg, params)
    family = transformers.AlbertForMaskedLM if cfg.share_layers else transformers.BertForMaskedLM
    hf, info = family.from_pretrained(str(tmp_path), output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        want = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                         token_type_ids=torch.tensor(types)).logits.numpy()
    got = np.asarray(BertForMaskedLM(cfg).apply({"params": params}, jnp.asarray(ids),
                                                piece_ids=jnp.asarray(attention), token_types=jnp.asarray(types)))
    valid = attention.astype(bool)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5)

    hf_config_dict, state = load_hf_checkpoint(str(tmp_path))
    imported_cfg = config_from_hf(hf_config_dict)
    if cfg.position.segment == "input":  # a zero token-type table stands in for segment='none'
        assert imported_cfg == cfg
        jax.tree.map(np.testing.assert_array_equal, bert_mlm_params(state, imported_cfg), params)


def test_bfloat16_huggingface_export_through_the_cli(tmp_path):
    pytest.importorskip("transformers")
    from jaxpos.checkpoints.huggingface import bert_mlm_params, config_from_hf, load_hf_checkpoint
    from safetensors.numpy import load_file

    saved = save_run(str(tmp_path / "run"), dict(kind="absolute"), steps=(3,))
    out = tmp_path / "hf"
    assert cli.main(["export", "--workdir", str(tmp_path / "run"), "--out", str(out), "--format", "huggingface",
                     "--dtype", "bfloat16"]) == 0
    assert {v.dtype for v in load_file(str(out / "model.safetensors")).values()} == {np.dtype(jnp.bfloat16)}
    hf_config_dict, state = load_hf_checkpoint(str(out))
    assert hf_config_dict["dtype"] == "bfloat16" and hf_config_dict["architectures"] == ["BertForMaskedLM"]
    jax.tree.map(np.testing.assert_array_equal, bert_mlm_params(state, config_from_hf(hf_config_dict)),
                 jax.tree.map(lambda x: np.asarray(x, np.float32), cast_params(saved[3], "bfloat16")))


@pytest.mark.parametrize("overrides, field", [
    (dict(position=dict(kind="rope")), "model.position.kind='rope'"),
    (dict(position=dict(kind="absolute", segment="per_head")), "model.position.segment='per_head'"),
    (dict(position=dict(kind="absolute", content_only=True)), "model.position.content_only=True"),
    (dict(layer_norm="pre"), "model.layer_norm='pre'"),
    (dict(embedding_dim=16), "model.embedding_dim=16 without share_layers"),
    (dict(share_layers=True, causal=True), "model.causal=True with share_layers"),
    (dict(num_decoder_layers=2), "model.num_decoder_layers=2"),
    (dict(scale_embeddings=True), "model.scale_embeddings=True"),
    (dict(embed_layer_norm=False), "model.embed_layer_norm=False"),
])
def test_what_transformers_cannot_express_is_refused_by_name(overrides, field):
    values = dict(TINY_MODEL, position=dict(kind="absolute"))
    values.update(overrides)
    with pytest.raises(ValueError, match=re.escape(f"the Hugging Face format cannot express {field}")):
        hf_config(model_config(values))
