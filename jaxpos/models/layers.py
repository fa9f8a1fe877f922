"""Transformer building blocks shared by the encoder (BERT) and the encoder-decoder: layers and the stack."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxpos.attention.bias import PositionalBias, SegmentTable
from jaxpos.attention.layer import MultiHeadAttention, dense
from jaxpos.attention.mask import AttentionMask
from jaxpos.config import LayerPlan, ModelConfig
from jaxpos.config.model import SAVED_NAMES
from jaxpos.config.rng import DROPOUT, POSITIONS
from jaxpos.models.layout import scan_names
from jaxpos.positions import SegmentAttention, make_position
from jaxpos.positions.base import FIXED_POSITIONS_SEED, randomized_positions
from jaxpos.sharding import HIDDEN, MLP_HIDDEN, constrain


def layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
    """LayerNorm g*(x - m)/sqrt(var + eps) + b (no b without `model.norm_bias`) with logically named parameters."""
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps, use_bias=cfg.norm_bias, name=name, dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


def activation(name: str):
    """The feed-forward nonlinearity named by `ModelConfig.activation`: "gelu" (erf), "gelu_tanh" or "relu"."""
    return {"gelu": lambda x: nn.gelu(x, approximate=False),
            "gelu_tanh": lambda x: nn.gelu(x, approximate=True), "relu": nn.relu}[name]


def gate_activation(cfg: ModelConfig):
    """The nonlinearity of a gated MLP's first half: `activation` (a GELU) for geglu, SiLU for swiglu."""
    return nn.silu if cfg.mlp == "swiglu" else activation(cfg.activation)


class MlpBlock(nn.Module):
    """The feed-forward sublayer, no residual. plain (`model.mlp`): W2 act(W1 x + b1) + b2, params wi [d, mlp_dim],
    wo [mlp_dim, d]; geglu / swiglu: one projection wi [d, 2, mlp_dim] to (u, g), then W2 (act(u) * g) + b2, as
    transformers' ModernBERT splits its Wi (the first half activated, the second the gate)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        """x [..., d] -> [..., d]."""
        cfg = self.cfg
        if cfg.mlp == "plain":
            h = dense(cfg, cfg.mlp_dim, -1, ("embed", "mlp"), ("mlp",), "wi", cfg.use_bias)(x)
            h = activation(cfg.activation)(h)
        else:  # the (2,) axis unsharded, so each tensor shard holds both halves of its mlp columns
            h = dense(cfg, (2, cfg.mlp_dim), -1, ("embed", None, "mlp"), (None, "mlp"), "wi", cfg.use_bias)(x)
            h = gate_activation(cfg)(h[..., 0, :]) * h[..., 1, :]
        h = constrain(h, MLP_HIDDEN)
        return dense(cfg, cfg.d_model, -1, ("mlp", "embed"), ("embed",), "wo", cfg.use_bias)(h)


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention, MLP; each a residual sublayer, post-LN (BERT) or pre-LN.
    `deterministic` (no dropout) is an attribute, not an argument, so rematerialisation and scans see only
    arrays in a call. Its entry of the plan of layers (`ModelConfig.plan`) says the rest: a layer with a `window`
    attends to the keys within it; one without `positions` (NoPE) gets its bias without the mechanism's terms
    (`layer_bias`); without `attention_norm` (pre-LN) its self-attention reads x itself (ModernBERT's first
    layer)."""

    cfg: ModelConfig
    cross_attention: bool = False
    decode: bool = False
    deterministic: bool = True
    plan: LayerPlan = LayerPlan()

    @nn.compact
    def __call__(self, x, bias, q_pos, k_pos, mask, types, encoded=None, cross_bias=None, cross_pos=None,
                 cross_mask=None):
        """x [B, T, d] -> [B, T, d]. bias (this layer's `PositionalBias`), q_pos [T], k_pos [S], mask
        (`AttentionMask`) and types [B, T] feed self-attention; encoded [B, S_enc, d], cross_bias, cross_pos (query
        positions [T], encoder positions [S_enc]; per pair [B, T], [B, S_enc] in packed rows), cross_mask
        cross-attention."""
        cfg, deterministic = self.cfg, self.deterministic

        def sublayer(x, fn, name, normed=True):
            drop = nn.Dropout(cfg.dropout)
            if not normed:
                return x + drop(fn(x), deterministic=deterministic)
            norm = layer_norm(cfg, f"{name}_norm")
            if cfg.layer_norm == "post":
                return norm(x + drop(fn(x), deterministic=deterministic))
            return x + drop(fn(norm(x)), deterministic=deterministic)

        if self.plan.window is not None:  # a static window, so that the kernels can skip the blocks outside it
            mask = mask.replace(window=self.plan.window)
        self_attention = MultiHeadAttention(cfg, self_attention=True, decode=self.decode,
                                            nope=not self.plan.positions, name="self_attention")
        x = sublayer(x, lambda h: self_attention(h, h, bias=bias, q_pos=q_pos, k_pos=k_pos, mask=mask,
                                                 q_types=types, k_types=types,
                                                 deterministic=deterministic), "self_attention",
                     normed=self.plan.attention_norm)
        if self.cross_attention:
            cross = MultiHeadAttention(cfg, self_attention=False, name="cross_attention")
            x = sublayer(x, lambda h: cross(h, encoded, bias=cross_bias, q_pos=cross_pos[0], k_pos=cross_pos[1],
                                            mask=cross_mask, deterministic=deterministic), "cross_attention")
        return sublayer(x, lambda h: MlpBlock(cfg, name="mlp")(checkpoint_name(h, "mlp_input")), "mlp")


def stack_bias(bias: PositionalBias, q_pos, k_pos, *, randomized: bool, input_positions=None) -> PositionalBias:
    """The mechanism's bias as the stack's layers read it: at scattered positions read there once per pass
    (randomized positions: a Toeplitz table becomes the matrix of the sampled positions), and in packed rows with
    each piece's positions for the terms that read positions, not offsets (`Term.offset_invariant`)."""
    if randomized:
        bias = bias.at_positions(q_pos, k_pos)
    if input_positions is not None and any(not t.offset_invariant for t in bias.terms):
        bias = bias.replace(piece_positions=(input_positions, input_positions))  # packed rows: read per piece
    return bias


def attention_terms(cfg: ModelConfig) -> frozenset[str]:
    """The kinds of attention terms the layers of a model receive (jaxpos.attention.terms), for the check of its
    attention implementation: its mechanism's bias traced abstractly (no parameter is made), as each stack reads
    it, with per-head segments and the layers' own (sinks, length scale); none of the mechanism's where every layer
    is NoPE."""
    stacks = [(cfg.num_layers, cfg.causal)]
    if cfg.num_decoder_layers:  # the decoder (causal), and its cross-attention where positions enter it
        stacks = [(cfg.num_layers, False), (cfg.num_decoder_layers, True)] + (
            [(cfg.num_decoder_layers, False)] if cfg.cross_attention_position else [])
    length = min(cfg.max_length, 8)
    randomized = cfg.position.randomized_max_length

    def bias_of(num_layers: int, causal: bool) -> PositionalBias:
        pos = jnp.arange(length, dtype=jnp.int32)
        module = make_position(cfg, num_layers, causal, min_span=randomized or 0)
        bias, _ = module.init_with_output(jax.random.PRNGKey(0), pos, pos)
        return stack_bias(bias, pos, pos, randomized=bool(randomized))

    kinds = {kind for kind, on in (("sink", cfg.attention_sinks), ("length_scale", cfg.length_scaled_logits)) if on}
    if any(layer.positions for layer in cfg.plan) or cfg.num_decoder_layers:
        for num_layers, causal in stacks:
            kinds |= jax.eval_shape(lambda n=num_layers, c=causal: bias_of(n, c)).kinds
    if cfg.position.segment == "per_head":
        kinds.add("segment")
    return frozenset(kinds)


def remat_layer(policy: str, scanned: bool) -> type[nn.Module]:
    """TransformerLayer, rematerialised in the backward pass under `model.remat` (config.model.REMAT_POLICIES)."""
    if policy == "none":
        return TransformerLayer
    saved = {"full": jax.checkpoint_policies.nothing_saveable,
             "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
             "save_projections": jax.checkpoint_policies.save_only_these_names(*SAVED_NAMES)}[policy]
    # Outside a scan XLA's common-subexpression elimination could undo the recomputation: keep it from doing so.
    return nn.remat(TransformerLayer, policy=saved, prevent_cse=not scanned)


def layer_bias(bias: PositionalBias | None, depth, plan: LayerPlan) -> PositionalBias | None:
    """Layer `depth`'s slice of the stack's bias (`depth` may be traced, inside a scan), without the mechanism's
    terms where the plan makes the layer NoPE."""
    if bias is None:
        return None
    bias = bias.for_layer(depth)
    return bias if plan.positions else bias.without_positions()


class ScannedGroup(nn.Module):
    """One step of the stack's scan: `size` consecutive layers, the first of them layer start + index * size
    (`index` a traced scalar), on the carried hidden states; each reads its slice of the stack's bias inside (the
    bias, computed once per forward pass, enters the scan once, broadcast); the group's plan (windows, positions)
    is the same in every group (size: the plan's period). Returns (x, the group's outputs [size, B, T, d])."""

    cfg: ModelConfig
    start: int = 0
    size: int = 1
    cross_attention: bool = False
    decode: bool = False
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, index, bias, q_pos, k_pos, mask, types, encoded, cross_bias, cross_pos, cross_mask):
        outputs = []
        for j, name in enumerate(scan_names((self.start, self.size))[1]):
            plan = self.cfg.plan[self.start + j]  # the same in every group: the plan's period
            layer = remat_layer(self.cfg.remat, scanned=True)(self.cfg, self.cross_attention, self.decode,
                                                               self.deterministic, plan=plan, name=name)
            depth = self.start + index * self.size + j
            x = layer(x, layer_bias(bias, depth, plan), q_pos, k_pos, mask, types, encoded,
                      layer_bias(cross_bias, depth, plan), cross_pos, cross_mask)
            x = constrain(x, HIDDEN)
            outputs.append(x)
        return x, jnp.stack(outputs)


class TransformerStack(nn.Module):
    """L layers and everything positional: input position embeddings, the bias computed once per forward
    pass, the masks, and (with `decode`) the step counter of incremental decoding.

    x [B, T, E] are token (and token-type) embeddings (E = d_model unless embeddings are factorised); returns hidden states [B, T, d].
    `piece_ids` [B, T]: packing-piece ids, 0 = padding; `token_types` [B, T]: segments for per-head
    segment attention; `input_positions` [B, T]: positions within each sequence when a row packs several (each
    restarting at 0), for the input position embeddings and for the position-only terms that depend on absolute
    positions (DIET-Abs, TUPE factors; attenuated matrices), which attention reads there. Toeplitz biases need
    no such positions: the packing mask keeps every query inside its own sequence, where offsets j - i are the
    same as in a row of its own. Cross-attention is the exception: a packed pair's source and target start at
    different columns, so with model.cross_attention_position it takes positions within each pair on both sides
    (`input_positions` and `encoded_positions` [B, S_enc]). Linformer (DIET-Abs with linformer_k) projects keys
    along the whole row and so mixes the sequences of a packed row; traced piece ids cannot show whether a row
    packs several, so runs refuse the combination from their config (`jaxpos.config.run.check_packing`).
    """

    cfg: ModelConfig
    num_layers: int
    causal: bool = False
    cross_attention: bool = False
    decode: bool = False

    def positions(self, length: int):
        """(q_pos [T], k_pos [S]): arange for a full pass; (step, cache positions) when decoding."""
        full = jnp.arange(length, dtype=jnp.int32)
        if not self.decode:
            return full, full
        initialised = self.has_variable("cache", "index")
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        cache_positions = self.variable("cache", "positions", lambda: full)
        if not initialised:
            return full, full
        step = index.value
        index.value = step + 1
        return step[None], cache_positions.value

    @nn.compact
    def __call__(self, x, *, piece_ids=None, token_types=None, input_positions=None, encoded=None,
                 encoded_piece_ids=None, encoded_positions=None, deterministic: bool = True):
        cfg = self.cfg
        randomized = cfg.position.randomized_max_length
        # offset tables over the whole range when positions are drawn from it
        position = make_position(cfg, self.num_layers, self.causal, min_span=randomized or 0)
        q_pos, k_pos = self.positions(x.shape[1])
        if randomized and not self.decode:
            key = self.make_rng(POSITIONS) if not deterministic else jax.random.PRNGKey(FIXED_POSITIONS_SEED)
            q_pos = k_pos = randomized_positions(key, x.shape[1], randomized)
            input_positions = None  # a packed piece takes the sampled positions of the columns it occupies
            self.sow("intermediates", "positions", q_pos)
        position_embedding = position.embed(q_pos if input_positions is None or self.decode else input_positions)
        if position_embedding is not None:
            x = x + jnp.broadcast_to(position_embedding, x.shape[:2] + position_embedding.shape[-1:]).astype(x.dtype)
        if cfg.embed_layer_norm:
            x = layer_norm(cfg, "embed_norm")(x)
        x = nn.Dropout(cfg.dropout)(x, deterministic=deterministic)
        if cfg.embedding_dim:  # factorised embeddings (ALBERT): project E -> d_model
            x = dense(cfg, cfg.d_model, -1, (None, "embed"), ("embed",), "embed_projection")(x)
        # The batch, not the fsdp-sharded embedding table, decides how the residual stream is split.
        x = constrain(x, HIDDEN)

        bias = stack_bias(position(q_pos, k_pos), q_pos, k_pos, randomized=bool(randomized),
                          input_positions=None if self.decode else input_positions)  # once per pass, all layers
        if cfg.position.segment == "per_head":
            segments = SegmentAttention(self.num_layers, cfg.num_heads, cfg.position.num_segments, cfg.init_std,
                                        name="segments")
            bias = bias.add(SegmentTable(segments()))
            if token_types is None:
                token_types = jnp.zeros(x.shape[:2], jnp.int32)
        mask = AttentionMask.within_pieces(piece_ids, causal=self.causal)

        cross_bias = cross_mask = cross_pos = None
        if self.cross_attention:
            enc_pos = jnp.arange(encoded.shape[1], dtype=jnp.int32)
            cross_bias, cross_pos = PositionalBias(), (q_pos, enc_pos)
            if cfg.cross_attention_position:
                # A cached step's query sits anywhere in the cache (k_pos), possibly past the source length.
                cross_position = make_position(cfg, self.num_layers, False, name="cross_position",
                                               min_span=k_pos.shape[0])
                cross_bias = cross_position(q_pos, enc_pos)
                if not self.decode and (input_positions is not None or encoded_positions is not None):
                    # Packed pairs: offsets and absolute reads use the positions within each pair on both sides.
                    batch = x.shape[0]
                    cross_pos = (q_pos[None].repeat(batch, 0) if input_positions is None else input_positions,
                                 enc_pos[None].repeat(batch, 0) if encoded_positions is None else encoded_positions)
                    cross_bias = cross_bias.replace(piece_positions=cross_pos)
            cross_mask = AttentionMask(q_piece_ids=None if self.decode else piece_ids, kv_piece_ids=encoded_piece_ids)

        self.sow("intermediates", "hidden_states", x)  # analysis taps: the input of layer 0, then each output
        args = (bias, (q_pos, k_pos, mask, token_types, encoded), cross_bias, cross_pos, cross_mask)
        x = self.scanned_layers(x, *args, deterministic) if cfg.scan_layers else \
            self.unscanned_layers(x, range(self.num_layers), *args, deterministic)
        if cfg.layer_norm == "pre":
            x = layer_norm(cfg, "final_norm")(x)
        return x

    def unscanned_layers(self, x, depths, bias, inputs, cross_bias, cross_pos, cross_mask, deterministic):
        """Layers `depths` one after the other, each with its own parameters (layer_i), or ALBERT's shared ones."""
        cfg = self.cfg
        layer_class = remat_layer(cfg.remat, scanned=False)
        shared = layer_class(cfg, self.cross_attention, self.decode, deterministic, name="layer_shared") \
            if cfg.share_layers else None  # config checks keep local windows and a norm-less first layer from it
        for i in depths:
            plan = cfg.plan[i] if i < len(cfg.plan) else LayerPlan()  # a decoder stack: plain layers
            layer = shared or layer_class(cfg, self.cross_attention, self.decode, deterministic, plan=plan,
                                          name=f"layer_{i}")
            x = layer(x, layer_bias(bias, i, plan), *inputs, layer_bias(cross_bias, i, plan), cross_pos, cross_mask)
            x = constrain(x, HIDDEN)
            self.sow("intermediates", "hidden_states", x)
        return x

    def scanned_layers(self, x, bias, inputs, cross_bias, cross_pos, cross_mask, deterministic):
        """The layers as one scan over groups of `cfg.scan_group` layers, whose parameters are stacked on a
        leading "layers" axis (compile time flat in depth); a first layer without its attention norm runs before
        the scan, the layers after the last whole group after it.

        Layers differ in a static window (the kernels skip the blocks outside it) and in whether they read
        positions, so the scan steps over groups of the plan's period that repeat one static pattern, not over
        single layers with the window as data."""
        cfg = self.cfg
        start, size = cfg.scan_group
        count = (self.num_layers - start) // size
        x = self.unscanned_layers(x, range(min(start, self.num_layers)), bias, inputs, cross_bias, cross_pos,
                                  cross_mask, deterministic)
        if count:
            scan = nn.scan(ScannedGroup, variable_axes={"params": 0, "cache": 0, "intermediates": 0},
                           split_rngs={"params": True, DROPOUT: True}, length=count,
                           in_axes=(0,) + (nn.broadcast,) * 9, metadata_params={nn.PARTITION_NAME: "layers"})
            x, hidden = scan(cfg, start, size, self.cross_attention, self.decode, deterministic,
                             name=scan_names((start, size))[0])(x, jnp.arange(count), bias, *inputs, cross_bias,
                                                                  cross_pos, cross_mask)
            for output in hidden.reshape(count * size, *hidden.shape[2:]):
                self.sow("intermediates", "hidden_states", output)
        return self.unscanned_layers(x, range(start + count * size, self.num_layers), bias, inputs, cross_bias,
                                     cross_pos, cross_mask, deterministic)
