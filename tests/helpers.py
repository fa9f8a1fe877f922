"""Small shared builders for the tests."""

from __future__ import annotations

from jaxpos.config import MECHANISMS, model_config

TINY = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16,
            dropout=0.0, attention_dropout=0.0)

# The options of each kind's own variant (named after the kind) where they differ from the defaults.
KIND_OPTIONS = {
    "shaw": dict(shaw=dict(clip=3)),  # a clip that 16-token rows reach
}
# The variants beside each kind's own, as options of that kind: {kind: {id: options}}.
KIND_VARIANTS = {
    "tisa": {"tisa_input": dict(tisa=dict(input_positions=True)), "tisa_head_shared": dict(tisa=dict(sharing="head"))},
    "diet_rel": {"diet_rel_layer_shared_clipped": dict(diet_rel=dict(sharing="layer", max_distance=5)),
                 "diet_rel_per_head_segments": dict(segment="per_head")},
    "diet_abs": {"diet_abs_unfolded_none": dict(diet_abs=dict(fold=False, sharing="none", rank=6))},
    "attenuated": {"attenuated_matrix": dict(attenuated=dict(form="matrix", sharing="head")),
                   "attenuated_offset": dict(attenuated=dict(form="offset")),
                   "attenuated_abs_offset": dict(attenuated=dict(form="abs_offset"))},
}
# Every registered mechanism, each followed by its variants, as (id, position block).
VARIANTS = [(name, dict(kind=kind, **options)) for kind in MECHANISMS
            for name, options in {kind: KIND_OPTIONS.get(kind, {}), **KIND_VARIANTS.get(kind, {})}.items()]


def tiny_config(position: dict, **overrides):
    values = dict(TINY, position=position)
    values.update(overrides)
    return model_config(values)
