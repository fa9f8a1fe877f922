"""The one masking helper: padding, packed pieces and causality as one boolean [B|1, 1, T, S] mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(*, q_piece_ids: jax.Array | None = None, k_piece_ids: jax.Array | None = None,
                   q_pos: jax.Array | None = None, k_pos: jax.Array | None = None,
                   causal: bool = False) -> jax.Array | None:
    """True where query i may attend to key j.

    q_piece_ids [B, T], k_piece_ids [B, S]: packing-piece ids, 0 = padding (padded keys are never attended;
    queries attend only within their own piece). q_pos [T], k_pos [S]: positions, used when `causal`.
    Returns [B|1, 1, T, S] bool, or None when nothing is masked.
    """
    mask = None

    def both(m):
        return m if mask is None else jnp.logical_and(mask, m)

    if k_piece_ids is not None:
        mask = both((k_piece_ids != 0)[:, None, None, :])
        if q_piece_ids is not None:
            mask = both(q_piece_ids[:, None, :, None] == k_piece_ids[:, None, None, :])
    if causal:
        if q_pos is None or k_pos is None:
            raise ValueError("a causal mask needs q_pos and k_pos")
        mask = both((k_pos[None, :] <= q_pos[:, None])[None, None])
    return mask

