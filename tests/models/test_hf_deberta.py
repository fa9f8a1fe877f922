"""position.kind='deberta' against Hugging Face's PyTorch DebertaV2Model / DebertaV2ForMaskedLM (peer reference):
random models saved with save_pretrained, imported by jaxpos's importer, compared on a padded batch."""

import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxpos.checkpoints.huggingface import (bert_encoder_params, bert_mlm_params, bert_pooler_params,  # noqa: E402
                                            config_from_hf, load_hf_checkpoint)
from jaxpos.models import BertEncoder, BertForMaskedLM  # noqa: E402
from tests.models.hf_checks import assert_attention_weights_match, max_error_on_valid_rows  # noqa: E402

# DeBERTa-v3's attention at a small size: 8 log buckets reaching offset 11, so 17-token rows see exact, log-spaced
# and clamped offsets.
DEBERTA_CONFIG = dict(vocab_size=97, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=80,
                      max_position_embeddings=40, type_vocab_size=0, hidden_act="gelu", relative_attention=True,
                      position_biased_input=False, pos_att_type=["p2c", "c2p"], share_att_key=True,
                      norm_rel_ebd="layer_norm", position_buckets=8, max_relative_positions=12,
                      initializer_range=0.1, attn_implementation="eager")  # terms far from 0
# Without buckets: offsets clamped to +-6 (12 table rows).
UNBUCKETED = dict(DEBERTA_CONFIG, position_buckets=-1, max_relative_positions=6)


def inputs(types: bool = False):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 97, size=(3, 17))
    attention = np.ones_like(ids)
    attention[1, 12:] = 0
    attention[2, 5:] = 0
    token_types = (np.arange(17)[None, :] >= 8).astype(np.int64).repeat(3, 0) * int(types)
    return ids, attention, token_types


def randomise(module):
    """Non-trivial LayerNorm parameters and biases, which transformers initialises to ones and zeros."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.2)


def hf_outputs(hf, ids, attention, types):
    with torch.no_grad():
        return hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention),
                  token_type_ids=torch.tensor(types), output_attentions=True)


@pytest.mark.parametrize("hf_config", [DEBERTA_CONFIG, UNBUCKETED, dict(DEBERTA_CONFIG, type_vocab_size=2)],
                         ids=["buckets", "clamped", "token_types"])
def test_hidden_states_and_attention_weights_match_deberta_v2(hf_config, tmp_path):
    torch.manual_seed(0)
    hf = transformers.DebertaV2Model(transformers.DebertaV2Config(**hf_config)).eval()
    randomise(hf)
    hf.save_pretrained(tmp_path)
    config, state = load_hf_checkpoint(str(tmp_path))
    cfg = config_from_hf(config)
    assert cfg.position.kind == "deberta" and cfg.attention_impl == "auto"
    assert cfg.position.segment == ("input" if hf_config["type_vocab_size"] else "none")
    ids, attention, types = inputs(types=bool(hf_config["type_vocab_size"]))
    want = hf_outputs(hf, ids, attention, types)
    hidden, captured = BertEncoder(cfg).apply({"params": bert_encoder_params(state, cfg)}, jnp.asarray(ids),
                                              piece_ids=jnp.asarray(attention), token_types=jnp.asarray(types),
                                              mutable=["intermediates"])
    # Padded query rows are not meaningful (transformers zeroes their embeddings and lets them attend everywhere).
    assert max_error_on_valid_rows(hidden, want.last_hidden_state.numpy(), attention) < 1e-5
    assert_attention_weights_match(captured, want.attentions, attention, 3)


@pytest.mark.parametrize("legacy", [True, False], ids=["cls_predictions", "lm_predictions"])
def test_mlm_logits_match_deberta_v2_for_masked_lm(legacy, tmp_path):
    torch.manual_seed(1)
    hf = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**DEBERTA_CONFIG, legacy=legacy)).eval()
    randomise(hf)
    hf.save_pretrained(tmp_path)
    config, state = load_hf_checkpoint(str(tmp_path))
    assert any(k.startswith("cls.predictions." if legacy else "lm_predictions.lm_head.") for k in state)
    cfg = config_from_hf(config)
    ids, attention, types = inputs()
    want = hf_outputs(hf, ids, attention, types).logits.numpy()
    got = BertForMaskedLM(cfg).apply({"params": bert_mlm_params(state, cfg)}, jnp.asarray(ids),
                                     piece_ids=jnp.asarray(attention))
    assert max_error_on_valid_rows(got, want, attention) < 2e-5


def test_the_context_pooler_is_not_read_as_a_bert_pooler():
    torch.manual_seed(2)
    hf = transformers.DebertaV2ForSequenceClassification(transformers.DebertaV2Config(**DEBERTA_CONFIG))
    assert any(k.startswith("pooler.dense") for k in hf.state_dict())
    assert bert_pooler_params(hf.state_dict()) is None


# config.json of microsoft/deberta-v3-base
DEBERTA_V3_BASE = dict(
    model_type="deberta-v2", attention_probs_dropout_prob=0.1, hidden_act="gelu", hidden_dropout_prob=0.1,
    hidden_size=768, initializer_range=0.02, intermediate_size=3072, max_position_embeddings=512,
    relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
    pos_att_type="p2c|c2p", layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False,
    num_attention_heads=12, num_hidden_layers=12, type_vocab_size=0, vocab_size=128100)


def test_deberta_v3_base_config_imports_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = config_from_hf(DEBERTA_V3_BASE)
    pcfg = cfg.position
    assert (pcfg.kind, pcfg.segment, pcfg.deberta.position_buckets, pcfg.deberta.max_relative_positions) == (
        "deberta", "none", 256, 512)
    assert cfg.layer_norm_eps == 1e-7 and cfg.activation == "gelu" and cfg.tie_embeddings
    defaults = {k: v for k, v in DEBERTA_V3_BASE.items() if k not in ("layer_norm_eps", "type_vocab_size")}
    assert config_from_hf(defaults).layer_norm_eps == 1e-7  # transformers' DeBERTa default, not BERT's


@pytest.mark.parametrize("field, value", [
    ("relative_attention", False), ("position_biased_input", True), ("share_att_key", False),
    ("pos_att_type", ["c2p"]), ("pos_att_type", "p2p|c2p"), ("norm_rel_ebd", "none"), ("conv_kernel_size", 3),
    ("embedding_size", 128), ("attention_head_size", 32)])
def test_unrepresentable_deberta_fields_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        config_from_hf(dict(DEBERTA_V3_BASE, **{field: value}))
