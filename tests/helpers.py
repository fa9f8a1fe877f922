"""Small shared builders for the tests."""

from __future__ import annotations

import contextlib
import hashlib
import os
from unittest import mock

from jaxpos.config import model_config
from jaxpos.positions import MECHANISMS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MLM_CONFIG = os.path.join(ROOT, "configs", "mlm", "tiny.py")
# configs/mlm/tiny.py made smaller still, as --config overrides: seconds to start, a few milliseconds a step.
SMALL_MLM = ["--config.model.d_model=32", "--config.model.num_layers=1", "--config.model.mlp_dim=48",
             "--config.model.max_length=32", "--config.data.seq_len=32", "--config.data.vocab_size=300",
             "--config.data.max_documents=20", "--config.data.tokenizer_max_sentences=2000",
             "--config.train.batch_size=8", "--config.train.eval_batches=1"]

TINY = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16,
            dropout=0.0, attention_dropout=0.0)

# The options of each kind's own variant (named after the kind) where they differ from the defaults.
KIND_OPTIONS = {
    "shaw": dict(shaw=dict(clip=3)),  # a clip that 16-token rows reach
    "deberta": dict(deberta=dict(position_buckets=8, max_relative_positions=12)),  # log buckets and clamping too
}
# The variants beside each kind's own, as options of that kind: {kind: {id: options}}.
KIND_VARIANTS = {
    "tisa": {"tisa_input": dict(tisa=dict(input_positions=True)), "tisa_head_shared": dict(tisa=dict(sharing="head"))},
    "diet_rel": {"diet_rel_layer_shared_clipped": dict(diet_rel=dict(sharing="layer", max_distance=5)),
                 "diet_rel_per_head_segments": dict(segment="per_head")},
    "diet_abs": {"diet_abs_unfolded_none": dict(diet_abs=dict(fold=False, sharing="none", rank=6))},
    # RoPE's options change its tables only: one variant with a length rule and p-RoPE takes every path
    "rope": {"rope_yarn_partial": dict(rope=dict(scaling="yarn", factor=4.0, fraction=0.5))},
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


@contextlib.contextmanager
def one_device_training():
    """Runs trained through config.mesh in the block (a workflow or the CLI) use the first device only, so their
    programs compile for one device, not the 8 simulated ones: for tests of what a run writes and reads, not of how
    it shards (tests/training/test_mesh_training.py and test_multiprocess.py train on meshes)."""
    import jax
    import pytest

    from jaxpos.sharding import make_mesh
    from jaxpos.training import loop

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "make_mesh", lambda **sizes: make_mesh(**sizes, devices=jax.devices()[:1]))
        yield


def folder_digest(path) -> dict:
    """{relative path: sha256} of every file under `path`, and every folder (as None): equal digests, an unchanged
    folder."""
    digest = {}
    for root, folders, files in os.walk(path):
        for name in folders:
            digest[os.path.relpath(os.path.join(root, name), path)] = None
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                digest[os.path.relpath(os.path.join(root, name), path)] = hashlib.sha256(f.read()).hexdigest()
    return digest


def train_tiny_mlm(workdir: str, checkpoint_every: int = 2, kind: str = "tisa", data: dict | None = None,
                   **model) -> str:
    """A tiny masked-LM run (TISA, or position `kind`; `model`: other model fields; `data`: data fields) of two
    steps on one device, as `jaxpos train` leaves it (its tokenizer trained on the embedded corpus); returns the
    workdir."""
    from jaxpos.config.defaults import mlm_config
    from jaxpos.workflows.mlm import train_mlm

    config = mlm_config()
    config.model.update(d_model=32, num_layers=1, num_heads=4, mlp_dim=48, max_length=32, **model)
    config.model.position.kind = kind
    config.data.update(seq_len=32, vocab_size=300, max_documents=20, tokenizer_max_sentences=2000, **(data or {}))
    config.train.update(num_steps=2, batch_size=8, log_every=1, eval_every=2, eval_batches=1,
                        checkpoint_every=checkpoint_every)
    with one_device_training():
        train_mlm(config, workdir)
    return workdir


@contextlib.contextmanager
def fake_gcs(root):
    """gs://BUCKET/PATH is ROOT/BUCKET/PATH in the block, for etils.epath (`epath.testing.mock_epath`) and for the
    two routes by which orbax reaches a bucket without etils: the storage client it asks whether the bucket has a
    hierarchical namespace (before listing checkpoint steps; a plain bucket here) and tensorstore's gcs driver,
    which reads and writes the arrays (a file driver on the same folder here). Local paths stay as they are."""
    from etils.epath import testing as epath_testing
    from orbax.checkpoint._src.path import gcs_utils

    root = str(root)

    def local(path):
        path = os.fspath(path)
        return os.path.join(root, path[len("gs://"):]) if path.startswith("gs://") else path

    def remote(path):
        return "gs://" + os.path.relpath(path, root) if path.startswith(root + os.sep) else path

    one = lambda fn, path, *args, **kwargs: fn(local(path), *args, **kwargs)  # noqa: E731
    two = lambda fn, path, dst, *args, **kwargs: fn(local(path), local(dst), *args, **kwargs)  # noqa: E731
    with epath_testing.mock_epath(
            open=one, exists=one, isdir=one, listdir=one, makedirs=one, mkdir=one, remove=one, rmtree=one, stat=one,
            walk=one, copy=two, rename=two, replace=two, glob=lambda fn, path: [remote(p) for p in fn(local(path))]), \
            mock.patch.object(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False), \
            mock.patch.object(gcs_utils, "get_kvstore_for_gcs", lambda path: {"driver": "file", "path": local(path)}):
        yield


def bias_terms(table=None, factors=None, dense=None, rel_keys=None, rel_values=None, segment_table=None,
               rotary=None, rotary_keys=None, kv_projection=None, contextual=None, rel_embeddings=None,
               rel_projections=None, rel_index=None, fold_factors=False, normalise_dense=False, content_scale=1.0,
               piece_positions=None):
    """A `PositionalBias` of the terms named by keyword (the tests' shorthand for building one by hand): each
    keyword the array(s) of one term of jaxpos.attention.terms, in the order of the stack's own biases."""
    from jaxpos.attention.bias import (Contextual, DenseBias, Disentangled, KeyProjection, LowRankFactors,
                                       PositionalBias, Rotary, SegmentTable, ShawRelative, ToeplitzTable)

    terms = []
    if rotary is not None:
        terms.append(Rotary(*rotary, *(rotary_keys if rotary_keys is not None else rotary)))
    if kv_projection is not None:
        terms.append(KeyProjection(kv_projection))
    if rel_keys is not None or rel_values is not None:
        terms.append(ShawRelative(rel_keys=rel_keys, rel_values=rel_values))
    if rel_index is not None:
        rel_q, rel_k = rel_projections or (None, None)
        terms.append(Disentangled(rel_embeddings=rel_embeddings, rel_index=rel_index, rel_q=rel_q, rel_k=rel_k))
    if contextual is not None:
        terms.append(Contextual(contextual))
    if table is not None:
        terms.append(ToeplitzTable(table))
    if factors is not None:
        terms.append(LowRankFactors(*factors, fold=fold_factors, keyed=kv_projection is None))
    if dense is not None:
        terms.append(DenseBias(dense, normalise=normalise_dense))
    if segment_table is not None:
        terms.append(SegmentTable(segment_table))
    return PositionalBias(terms=tuple(terms), piece_positions=piece_positions, content_scale=content_scale)


def extending_example() -> tuple[str, str]:
    """(module name, source) of docs/extending.md's example mechanism: its python block that opens with a comment
    naming the file (`# my_bias.py`)."""
    import re

    with open(os.path.join(ROOT, "docs", "extending.md"), encoding="utf-8") as f:
        text = f.read()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            return first[2:-3], block
    raise AssertionError("docs/extending.md has no python block opening with `# NAME.py`")
