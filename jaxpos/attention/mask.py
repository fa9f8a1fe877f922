"""The one attention mask: padding, packed pieces and causality as piece ids and a flag, dense only on demand."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxpos.attention.bias import relative_offsets


@flax.struct.dataclass
class AttentionMask:
    """Which keys each query may attend to, as the kernels read it.

    q_piece_ids [B, Tq], kv_piece_ids [B, Tk]: packing-piece ids, 0 = padding (padded keys are never attended;
    with query ids too, queries attend only within their own piece); None: not masked by ids. `causal` (static):
    a key is visible when its position is <= the query's. `window` (static): a local attention layer's window of
    keys around the query, |j - i| <= window // 2 (ModernBERT's local_attention = 128: 64 keys a side and the
    query's own); None: every key. `dense` gives the boolean mask for the paths that need one.
    """

    q_piece_ids: jax.Array | None = None
    kv_piece_ids: jax.Array | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    window: int | None = flax.struct.field(pytree_node=False, default=None)

    @classmethod
    def within_pieces(cls, piece_ids: jax.Array | None, causal: bool = False,
                      window: int | None = None) -> AttentionMask:
        """Self-attention over rows of packed pieces: piece_ids [B, T] on both sides (None: no padding, one
        sequence per row)."""
        return cls(q_piece_ids=piece_ids, kv_piece_ids=piece_ids, causal=causal, window=window)

    def dense(self, q_pos: jax.Array | None = None, k_pos: jax.Array | None = None) -> jax.Array | None:
        """True where query i may attend to key j: [B|1, 1, Tq, Tk] bool, or None when nothing is masked.
        q_pos [Tq], k_pos [Tk]: positions, needed when `causal`."""
        mask = None

        def both(m):
            return m if mask is None else jnp.logical_and(mask, m)

        if self.kv_piece_ids is not None:
            mask = both((self.kv_piece_ids != 0)[:, None, None, :])
            if self.q_piece_ids is not None:
                mask = both(self.q_piece_ids[:, None, :, None] == self.kv_piece_ids[:, None, None, :])
        if self.causal or self.window is not None:
            if q_pos is None or k_pos is None:
                raise ValueError("a causal or windowed mask needs q_pos and k_pos")
            offsets = relative_offsets(q_pos, k_pos)  # [T, S] / [B, T, S]
            offsets = offsets[None, None] if offsets.ndim == 2 else offsets[:, None]
            if self.causal:
                mask = both(offsets <= 0)
            if self.window is not None:
                mask = both(jnp.abs(offsets) <= self.window // 2)
        return mask
