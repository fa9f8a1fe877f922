"""Comparisons of jaxpos encoders with Hugging Face ones on padded batches."""

import numpy as np


def max_error_on_valid_rows(got, want, attention) -> float:
    """The largest |got - want| over the rows that `attention` [B, T] marks as tokens (padded rows carry nothing)."""
    valid = attention.astype(bool)
    return float(np.max(np.abs(np.asarray(got)[valid] - want[valid])))


def assert_attention_weights_match(captured, attentions, attention, num_layers: int):
    """The attention weights each layer sowed into `captured` against transformers' `attentions` ([B, H, T, S] per
    layer), on the query rows that are tokens."""
    encoder = captured["intermediates"]["encoder"]
    got = np.stack([encoder[f"layer_{i}"]["self_attention"]["attention_weights"][0] for i in range(num_layers)])
    weights = np.stack([a.numpy() for a in attentions])  # [L, B, H, T, S]
    rows = attention.astype(bool)
    for b in range(attention.shape[0]):
        np.testing.assert_allclose(got[:, b, :, rows[b]], weights[:, b, :, rows[b]], rtol=1e-5, atol=1e-6)
