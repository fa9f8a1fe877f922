"""The forward kernel of `pallas`: one query block of one (batch, head) per program, an online softmax over the
key blocks, out and the logsumexp the backward reads."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention.kernels.pallas_common import (Operands, PallasSpec, call_kernel, column_spec, ids_specs,
                                                    kernel_dims, kernel_grid, kernel_table, keys_spec, seq_spec,
                                                    table_spec, u_spec, w_spec)
from jaxpos.attention.kernels.pallas_tiles import (bias_tile, dot, key_blocks, loaded_id_range, overlaps,
                                                   pair_columns, pair_logits, pair_rows, tile_keep, tile_mask)

NEG = -1e30  # finite logit for masked entries: exp(NEG - NEG) = 1 keeps the running max of an empty row NaN-free


def _forward_kernel(q_ref, k_ref, v_ref, ext_ref, qseg_ref, kseg_ref, keys_ref, u_ref, w_ref, o_ref, lse_ref, *,
                    st: PallasSpec, id_range=loaded_id_range):
    """One query block of one (batch, head): online softmax over the key blocks it can see (`key_blocks`),
    writes out and logsumexp.

    With dropout the running sum (and so the logsumexp) is the undropped softmax's; the kept weights, scaled by
    1 / (1 - rate) at the end, multiply v.

    Per-query quantities (ids, running max and sum, logsumexp) are columns [bq, 1], key ids rows [1, bk]: the
    layouts that broadcast against a [bq, bk] tile on every backend.
    """
    bq, bk = st.block_q, st.block_k
    q_start = pl.program_id(2) * bq
    q = q_ref[...]
    q_ids = qseg_ref[...]
    keys = None if keys_ref is None else keys_ref[...]
    u_cols = pair_columns(u_ref, slice(None))
    q_range = id_range("q", pl.program_id(2), q_ids) if st.skip_tiles and st.use_q_pieces else None
    carry = (jnp.zeros(o_ref.shape, jnp.float32), jnp.full((bq, 1), NEG, jnp.float32),
             jnp.zeros((bq, 1), jnp.float32))

    def body(jb, carry):
        k_start = jb * bk
        k_ids = kseg_ref[:, pl.ds(k_start, bk)]

        def compute(carry):
            acc, m, l = carry
            k = k_ref[pl.ds(k_start, bk), :]
            v = v_ref[pl.ds(k_start, bk), :]
            s = dot(q, k, (1, 1)) * st.scale
            if ext_ref is not None:
                s = s + bias_tile(ext_ref, q_start, k_start, bq, bk, st)
            if u_cols is not None:
                s = s + pair_logits(u_cols, pair_rows(w_ref, pl.ds(k_start, bk)))
            mask = tile_mask(q_ids, k_ids, q_start, k_start, bq, bk, st)
            if mask is not None:
                s = jnp.where(mask, s, NEG)
            m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            p = jnp.exp(s - m_new)
            if mask is not None:
                p = jnp.where(mask, p, 0.0)
            correction = jnp.exp(m - m_new)
            keep = tile_keep(keys, k_start, bk, st)
            kept = p if keep is None else jnp.where(keep, p, 0.0)
            acc = acc * correction + dot(kept.astype(v.dtype), v, (1, 0))
            return acc, m_new, l * correction + jnp.sum(p, axis=1, keepdims=True)

        if not st.skip_tiles:
            return compute(carry)
        return lax.cond(overlaps(q_range, id_range("k", jb, k_ids), st), compute, lambda c: c, carry)

    acc, m, l = lax.fori_loop(*key_blocks(q_start, bq, bk, st, st.s_pad // bk), body, carry)
    seen = l > 0.0
    safe_l = jnp.where(seen, l, 1.0)
    o_ref[...] = (acc / (safe_l * (1.0 - st.dropout_rate))).astype(o_ref.dtype)
    # +inf for rows with no visible key: the backward's exp(s - lse) is then 0 there.
    lse_ref[...] = jnp.where(seen, m + jnp.log(safe_l), jnp.inf)


def forward(x: Operands, st: PallasSpec) -> tuple[jax.Array, jax.Array]:
    """The forward kernel on a call's operands -> (out like q with v's head width, logsumexp [B, H, T_pad, 1]
    float32)."""
    batch, heads, t_pad, dim = kernel_dims(x.q, st)
    dim_v = x.v.shape[-1]  # q and k may be wider (folded factors)
    bq = st.block_q
    whole = lambda i: 0  # noqa: E731
    q_ids, k_ids = ids_specs(st, bq, st.s_pad, k_block=whole)
    table = kernel_table(x.ext, st)
    return call_kernel(
        functools.partial(_forward_kernel, st=st), x._replace(ext=table), st,
        grid=kernel_grid(st, batch, heads, t_pad // bq),
        in_specs=[seq_spec(st, bq, dim), seq_spec(st, st.s_pad, dim, whole), seq_spec(st, st.s_pad, dim_v, whole),
                  table_spec(table, st), q_ids, k_ids, keys_spec(x.keys, st, bq), u_spec(x.u, st, bq),
                  w_spec(x.w, st, st.s_pad, whole)],
        out_specs=[seq_spec(st, bq, dim_v), column_spec(st, bq)],
        out_shape=[jax.ShapeDtypeStruct(x.q.shape[:-1] + (dim_v,), x.q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, t_pad, 1), jnp.float32)],
        name="toeplitz_pallas_attention_fwd", q_pieces=x.q_pieces, k_pieces=x.k_pieces)
