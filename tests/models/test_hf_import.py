"""The encoder against Hugging Face's PyTorch BertModel / AlbertModel with imported weights (peer reference)."""

import json
import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxpos.checkpoints.huggingface import (config_from_hf, bert_encoder_params, bert_mlm_params,  # noqa: E402
                                            hf_pooler_params, load_hf_checkpoint)
from jaxpos.models import BertEncoder, BertForMaskedLM  # noqa: E402
from jaxpos.checkpoints.huggingface import _family  # noqa: E402

HF_CONFIG = dict(vocab_size=97, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=80,
                 max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", attn_implementation="eager")


def hf_inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 97, size=(3, 17))
    attention = np.ones_like(ids)
    attention[1, 12:] = 0
    attention[2, 5:] = 0
    types = (np.arange(17)[None, :] >= 8).astype(np.int64).repeat(3, 0)
    return ids, attention, types


def assert_valid_close(got, want, attention, tol=1e-5):
    valid = attention.astype(bool)
    np.testing.assert_allclose(np.asarray(got)[valid], want[valid], rtol=tol, atol=tol)


def test_hidden_states_match_bert_model():
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**HF_CONFIG)).eval()
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                  token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
    cfg = config_from_hf(hf.config.to_dict())
    params = bert_encoder_params(hf.state_dict(), cfg)
    got = BertEncoder(cfg).apply({"params": params}, jnp.asarray(ids), piece_ids=jnp.asarray(attention),
                                 token_types=jnp.asarray(types))
    assert_valid_close(got, want, attention)


def test_mlm_logits_match_bert_for_masked_lm(tmp_path):
    torch.manual_seed(1)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**HF_CONFIG)).eval()
    with torch.no_grad():  # a non-zero output bias so the test sees it
        hf.cls.predictions.bias.normal_()
    want, got, attention, _ = mlm_logits(hf, tmp_path)
    assert_valid_close(got, want, attention, tol=2e-5)


def test_checkpoint_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor pytorch_model.bin"):
        load_hf_checkpoint(str(tmp_path))
    with pytest.raises(KeyError, match="encoder.layer.0.attention.self.query.weight"):
        bert_encoder_params({"embeddings.word_embeddings.weight": np.zeros((97, 48)),
                             "embeddings.position_embeddings.weight": np.zeros((40, 48)),
                             "embeddings.token_type_embeddings.weight": np.zeros((2, 48)),
                             "embeddings.LayerNorm.weight": np.zeros(48), "embeddings.LayerNorm.bias": np.zeros(48)},
                            config_from_hf(HF_CONFIG))


class _RunsOnLoad:
    """An object whose unpickling calls a function: what a malicious pytorch_model.bin carries."""

    def __reduce__(self):
        return (_record_load, ("ran",))


LOADS = []


def _record_load(value):
    LOADS.append(value)
    return value


def test_a_pickle_that_would_run_code_is_refused_in_one_line(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**HF_CONFIG)).eval()
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    torch.save({**hf.state_dict(), "payload": _RunsOnLoad()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"holds more than tensors .*never code") as refused:
        load_hf_checkpoint(str(tmp_path))
    assert "\n" not in str(refused.value) and LOADS == []  # refused before anything ran
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # tensors alone load as before
    _, state = load_hf_checkpoint(str(tmp_path))
    np.testing.assert_array_equal(state["embeddings.word_embeddings.weight"],
                                  hf.state_dict()["embeddings.word_embeddings.weight"].numpy())


ALBERT_CONFIG = dict(vocab_size=97, embedding_size=16, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=80, max_position_embeddings=40, attn_implementation="eager")


def captured_attention(variables_out, cfg):
    """[L, B, H, T, S] attention weights sown by each layer (a shared layer sows once per application)."""
    encoder = variables_out["intermediates"]["encoder"]
    if cfg.share_layers:
        return np.stack(encoder["layer_shared"]["self_attention"]["attention_weights"])
    return np.stack([encoder[f"layer_{i}"]["self_attention"]["attention_weights"][0] for i in range(cfg.num_layers)])


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_hidden_states_and_attention_weights_match(family, tmp_path):
    torch.manual_seed(2)
    if family == "bert":
        hf = transformers.BertModel(transformers.BertConfig(**HF_CONFIG))
    else:
        hf = transformers.AlbertModel(transformers.AlbertConfig(**ALBERT_CONFIG))
    hf.eval().save_pretrained(tmp_path)
    hf_config, state = load_hf_checkpoint(str(tmp_path))
    assert _family(state) == family
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                 token_type_ids=torch.tensor(types), output_attentions=True)
    cfg = config_from_hf(hf_config)
    hidden, captured = BertEncoder(cfg).apply({"params": bert_encoder_params(state, cfg)}, jnp.asarray(ids),
                                              piece_ids=jnp.asarray(attention), token_types=jnp.asarray(types),
                                              mutable=["intermediates"])
    assert_valid_close(hidden, out.last_hidden_state.numpy(), attention)
    got = captured_attention(captured, cfg)
    want = np.stack([a.numpy() for a in out.attentions])
    rows = attention.astype(bool)  # padded query rows differ by convention and are never used
    for b in range(ids.shape[0]):
        np.testing.assert_allclose(got[:, b, :, rows[b]], want[:, b, :, rows[b]], rtol=1e-5, atol=1e-6)


def test_albert_mlm_logits_match():
    torch.manual_seed(3)
    hf = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**ALBERT_CONFIG)).eval()
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                  token_type_ids=torch.tensor(types)).logits.numpy()
    cfg = config_from_hf(hf.config.to_dict())
    assert cfg.share_layers and cfg.embedding_dim == 16 and cfg.activation == "gelu_tanh"
    got = BertForMaskedLM(cfg).apply({"params": bert_mlm_params(hf.state_dict(), cfg)}, jnp.asarray(ids),
                                     piece_ids=jnp.asarray(attention), token_types=jnp.asarray(types))
    assert_valid_close(got, want, attention, tol=2e-5)


def test_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="unsupported Hugging Face model_type 'gpt2'"):
        config_from_hf(dict(HF_CONFIG, model_type="gpt2"))


def mlm_logits(hf, tmp_path):
    """(transformers logits, jaxpos logits) [B, T, V] of `hf` saved to and imported from tmp_path, and the mask."""
    hf.eval().save_pretrained(tmp_path)
    hf_config, state = load_hf_checkpoint(str(tmp_path))
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                  token_type_ids=torch.tensor(types)).logits.numpy()
    cfg = config_from_hf(hf_config)
    got = BertForMaskedLM(cfg).apply({"params": bert_mlm_params(state, cfg)}, jnp.asarray(ids),
                                     piece_ids=jnp.asarray(attention), token_types=jnp.asarray(types))
    return want, got, attention, cfg


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_untied_output_layer_matches(family, tmp_path):
    torch.manual_seed(4)
    if family == "bert":
        hf = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            max_position_embeddings=40, tie_word_embeddings=False, attn_implementation="eager"))
        head, embeddings = hf.cls.predictions, hf.bert.embeddings.word_embeddings
    else:
        hf = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**ALBERT_CONFIG, tie_word_embeddings=False))
        head, embeddings = hf.predictions, hf.albert.embeddings.word_embeddings
    with torch.no_grad():  # a decoder far from the embeddings and a bias of its own, so a tied import is far off
        head.decoder.weight.normal_()
        head.decoder.bias.normal_()
    assert head.decoder.weight.data_ptr() != embeddings.weight.data_ptr()
    want, got, attention, cfg = mlm_logits(hf, tmp_path)
    assert not cfg.tie_embeddings
    assert_valid_close(got, want, attention, tol=1e-4)


def test_untied_decoder_bias_falls_back_to_the_shared_bias():
    """transformers < 5 shares cls.predictions.decoder.bias with cls.predictions.bias and may save only the latter."""
    torch.manual_seed(5)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**HF_CONFIG, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        hf.cls.predictions.decoder.bias.normal_()
    state = {k: v for k, v in hf.state_dict().items() if k != "cls.predictions.decoder.bias"}
    state["cls.predictions.bias"] = hf.cls.predictions.decoder.bias.detach().clone()
    cfg = config_from_hf(hf.config.to_dict())
    params = bert_mlm_params(state, cfg)
    np.testing.assert_array_equal(params["decoder"]["bias"], hf.cls.predictions.decoder.bias.detach().numpy())
    np.testing.assert_array_equal(params["decoder"]["kernel"], hf.cls.predictions.decoder.weight.detach().numpy().T)


def test_is_decoder_imports_as_a_causal_encoder():
    torch.manual_seed(6)
    hf = transformers.BertModel(transformers.BertConfig(**HF_CONFIG, is_decoder=True)).eval()
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                  token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
    cfg = config_from_hf(hf.config.to_dict())
    assert cfg.causal
    got = BertEncoder(cfg).apply({"params": bert_encoder_params(hf.state_dict(), cfg)}, jnp.asarray(ids),
                                 piece_ids=jnp.asarray(attention), token_types=jnp.asarray(types))
    assert_valid_close(got, want, attention)


@pytest.mark.parametrize("name", ["gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh",
                                  "gelu_fast", "gelu_accurate", "relu"])
def test_mapped_activations_match_transformers(name):
    from transformers.activations import ACT2CLS, ACT2FN

    from jaxpos.models.layers import activation
    if name not in ACT2CLS:
        pytest.skip(f"this transformers has no {name}")
    x = np.linspace(-8, 8, 1601, dtype=np.float32)
    got = activation(config_from_hf(dict(HF_CONFIG, hidden_act=name)).activation)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), ACT2FN[name](torch.tensor(x)).numpy(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("field, value", [
    ("position_embedding_type", "relative_key"), ("position_embedding_type", "relative_key_query"),
    ("add_cross_attention", True), ("pruned_heads", {"0": [1]}), ("hidden_act", "silu"), ("hidden_act", "gelu_10"),
    ("num_hidden_groups", 2), ("inner_group_num", 2)])
def test_unrepresentable_fields_are_refused_by_name(field, value):
    base = dict(ALBERT_CONFIG, model_type="albert") if field in ("num_hidden_groups", "inner_group_num") \
        else HF_CONFIG
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        config_from_hf(dict(base, **{field: value}))


def test_unknown_fields_warn_by_name():
    with pytest.warns(UserWarning, match="'rotary_dim'"):
        config_from_hf(dict(HF_CONFIG, rotary_dim=16))


PUBLISHED_CONFIGS = {  # config.json of bert-base-uncased, bert-base-chinese and albert-base-v2 (transformers 4.x)
    "bert-base-uncased": dict(
        architectures=["BertForMaskedLM"], attention_probs_dropout_prob=0.1, gradient_checkpointing=False,
        hidden_act="gelu", hidden_dropout_prob=0.1, hidden_size=768, initializer_range=0.02, intermediate_size=3072,
        layer_norm_eps=1e-12, max_position_embeddings=512, model_type="bert", num_attention_heads=12,
        num_hidden_layers=12, pad_token_id=0, position_embedding_type="absolute", transformers_version="4.6.0.dev0",
        type_vocab_size=2, use_cache=True, vocab_size=30522),
    "bert-base-chinese": dict(
        architectures=["BertForMaskedLM"], attention_probs_dropout_prob=0.1, directionality="bidi", hidden_act="gelu",
        hidden_dropout_prob=0.1, hidden_size=768, initializer_range=0.02, intermediate_size=3072,
        layer_norm_eps=1e-12, max_position_embeddings=512, model_type="bert", num_attention_heads=12,
        num_hidden_layers=12, pad_token_id=0, pooler_fc_size=768, pooler_num_attention_heads=12,
        pooler_num_fc_layers=3, pooler_size_per_head=128, pooler_type="first_token_transform", type_vocab_size=2,
        vocab_size=21128),
    "albert-base-v2": dict(
        architectures=["AlbertForMaskedLM"], attention_probs_dropout_prob=0, bos_token_id=2,
        classifier_dropout_prob=0.1, down_scale_factor=1, embedding_size=128, eos_token_id=3, gap_size=0,
        hidden_act="gelu_new", hidden_dropout_prob=0, hidden_size=768, initializer_range=0.02, inner_group_num=1,
        intermediate_size=3072, layer_norm_eps=1e-12, max_position_embeddings=512, model_type="albert",
        net_structure_type=0, num_attention_heads=12, num_hidden_groups=1, num_hidden_layers=12,
        num_memory_blocks=0, pad_token_id=0, type_vocab_size=2, vocab_size=30000),
}


@pytest.mark.parametrize("name", [*PUBLISHED_CONFIGS, "BertConfig", "AlbertConfig"])
def test_published_and_default_configs_import_silently(name):
    """Every field of real configs and of this transformers' full to_dict() is classified: no warning."""
    hf = PUBLISHED_CONFIGS.get(name) or getattr(transformers, name)().to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = config_from_hf(hf)
    assert cfg.tie_embeddings and not cfg.causal and cfg.position.kind == "absolute"


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_pooler_matches_transformers(family, tmp_path):
    torch.manual_seed(7)
    if family == "bert":
        hf = transformers.BertModel(transformers.BertConfig(**HF_CONFIG))
    else:
        hf = transformers.AlbertModel(transformers.AlbertConfig(**ALBERT_CONFIG))
    hf.eval().save_pretrained(tmp_path)
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                 token_type_ids=torch.tensor(types))
    pooler = hf_pooler_params(str(tmp_path))
    assert pooler["kernel"].shape == (48, 48) and pooler["bias"].shape == (48,)
    hidden_cls = out.last_hidden_state[:, 0].numpy()
    np.testing.assert_allclose(np.tanh(hidden_cls @ pooler["kernel"] + pooler["bias"]), out.pooler_output.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_pooler_is_none_without_one(tmp_path):
    transformers.BertForMaskedLM(transformers.BertConfig(**HF_CONFIG)).save_pretrained(tmp_path)
    assert hf_pooler_params(str(tmp_path)) is None
