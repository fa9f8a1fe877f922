"""The encoder against Hugging Face's PyTorch BertModel / AlbertModel with imported weights (peer reference)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxpos.checkpoints.huggingface import (config_from_hf, bert_encoder_params, bert_mlm_params,  # noqa: E402
                                            load_hf_checkpoint)
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
    got = BertEncoder(cfg).apply({"params": params}, jnp.asarray(ids), segment_ids=jnp.asarray(attention),
                                 token_types=jnp.asarray(types))
    assert_valid_close(got, want, attention)


def test_mlm_logits_match_bert_for_masked_lm(tmp_path):
    torch.manual_seed(1)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**HF_CONFIG)).eval()
    with torch.no_grad():  # a non-zero output bias so the test sees it
        hf.cls.predictions.bias.normal_()
    hf.save_pretrained(tmp_path)
    hf_config, state = load_hf_checkpoint(str(tmp_path))
    ids, attention, types = hf_inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                  token_type_ids=torch.tensor(types)).logits.numpy()
    cfg = config_from_hf(hf_config)
    got = BertForMaskedLM(cfg).apply({"params": bert_mlm_params(state, cfg)}, jnp.asarray(ids),
                                     segment_ids=jnp.asarray(attention), token_types=jnp.asarray(types))
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
                                              segment_ids=jnp.asarray(attention), token_types=jnp.asarray(types),
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
                                     segment_ids=jnp.asarray(attention), token_types=jnp.asarray(types))
    assert_valid_close(got, want, attention, tol=2e-5)


def test_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="unsupported Hugging Face model_type 'gpt2'"):
        config_from_hf(dict(HF_CONFIG, model_type="gpt2"))
