"""Small shared builders for the tests."""

from __future__ import annotations

from jaxpos.config import model_config

TINY = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16,
            dropout=0.0, attention_dropout=0.0)

# Every mechanism, plus the variants the issue names, as (id, position block).
VARIANTS = [
    ("none", dict(kind="none")),
    ("absolute", dict(kind="absolute")),
    ("sinusoidal", dict(kind="sinusoidal")),
    ("tisa", dict(kind="tisa")),
    ("tisa_input", dict(kind="tisa", tisa=dict(input_positions=True))),
    ("tisa_head_shared", dict(kind="tisa", tisa=dict(sharing="head"))),
    ("diet_rel", dict(kind="diet_rel")),
    ("diet_rel_layer_shared_clipped", dict(kind="diet_rel", diet_rel=dict(sharing="layer", max_distance=5))),
    ("diet_abs", dict(kind="diet_abs")),
    ("diet_abs_unfolded_none", dict(kind="diet_abs", diet_abs=dict(fold=False, sharing="none", rank=6))),
    ("t5", dict(kind="t5")),
    ("shaw", dict(kind="shaw", shaw=dict(clip=3))),
    ("tupe", dict(kind="tupe")),
    ("rope", dict(kind="rope")),
    ("alibi", dict(kind="alibi")),
    ("attenuated", dict(kind="attenuated")),
    ("attenuated_matrix", dict(kind="attenuated", attenuated=dict(form="matrix", sharing="head"))),
    ("attenuated_offset", dict(kind="attenuated", attenuated=dict(form="offset"))),
    ("attenuated_abs_offset", dict(kind="attenuated", attenuated=dict(form="abs_offset"))),
    ("diet_rel_per_head_segments", dict(kind="diet_rel", segment="per_head")),
]


def tiny_config(position: dict, **overrides):
    values = dict(TINY, position=position)
    values.update(overrides)
    return model_config(values)
