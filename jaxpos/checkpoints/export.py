"""`jaxpos export`: a training run's parameters without its optimiser state, for inference, fine-tuning or analysis.

Two formats. `orbax` (any run: masked-LM, translation, fine-tuned classifier) writes a folder

    EXPORT/config.json       {"format": "jaxpos-export", "task", "model" (the ModelConfig), "num_labels", "step",
                              "dtype" (of every floating leaf; null: the model's own), "source", "tokenizer"}
    EXPORT/params/           an orbax checkpoint of the parameter tree only
    EXPORT/run_config.json   the run's own config.json (data and training settings)
    EXPORT/<name>.model      the run's tokenizer (or <name>.tokenizer.json), where it has one

that `load_export` restores onto one device or any (data, fsdp, tensor) mesh. `huggingface` (masked-LM runs that
transformers can express: learned absolute positions, post-LN BERT, or ALBERT for shared layers) writes
config.json + model.safetensors for `transformers.BertForMaskedLM` / `AlbertForMaskedLM.from_pretrained`, through
the importer's own name mapping (jaxpos/checkpoints/huggingface.py), so an export imports back to the same
parameters, and tokenizer.json + tokenizer_config.json for `AutoTokenizer.from_pretrained` (the run's ids). Local
paths or URLs that etils.epath and orbax handle (gs://...) work for EXPORT.

    jaxpos export --workdir runs/tiny --out exports/tiny                       # newest checkpoint, float32
    jaxpos export --workdir runs/tiny --out exports/tiny_bf16 --dtype bfloat16 --step 450
    jaxpos export --workdir runs/abs --out exports/abs_hf --format huggingface

    cfg, params = load_export("exports/tiny")                                     # on one device
    cfg, params = load_export("exports/tiny", mesh=make_mesh(data=2, fsdp=2, tensor=2))
"""

from __future__ import annotations

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import safetensors.numpy
from etils import epath

from jaxpos.checkpoints.huggingface import (_ACTIVATIONS, CONFIG_FIELDS, ENCODER_PREFIX, MLM_HEAD_PREFIX,
                                            encoder_layout, mlm_head_layout, to_hf)
from jaxpos.config import ModelConfig, model_config
from jaxpos.config.position import config_dict
from jaxpos.data.tokenizer import transformers_tokenizer_files
from jaxpos.run import Run, run_model
from jaxpos.sharding import placement
from jaxpos.training.checkpoint import abstract_like, checkpoint_path

FORMAT = "jaxpos-export"
FORMATS = ("orbax", "huggingface")
DTYPES = ("float32", "bfloat16", "float16")
# One Hugging Face hidden_act per jaxpos activation: the first name the importer maps onto it.
_HF_ACTIVATION = {jaxpos: hf for hf, jaxpos in reversed(_ACTIVATIONS.items())}


# --- parameters and folders -----------------------------------------------------------------------------------------

def _cast_dtype(dtype, to: str | None):
    """Floating leaves take `to`; integer leaves (and everything when `to` is None) keep their dtype."""
    return jnp.dtype(to) if to is not None and jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(dtype)


def cast_params(params, dtype: str | None):
    """The parameter tree with its floating leaves in `dtype` (numpy arrays; None keeps them as they are)."""
    return jax.tree.map(lambda x: np.asarray(x).astype(_cast_dtype(x.dtype, dtype)), params)


def _check_new(out: str) -> epath.Path:
    path = checkpoint_path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--out {out!r} already exists and is not empty; export into a new folder")
    return path


# --- export --------------------------------------------------------------------------------------------------------

def export_run(workdir: str, out: str, *, format: str = "orbax", dtype: str | None = None,
               step: int | None = None) -> dict:
    """Exports the parameters of WORKDIR's newest restorable checkpoint (or of `step`) to OUT in `format`, cast to
    `dtype` (default: as trained). Returns what was written: {"out", "format", "task", "step", "dtype"}.
    Raises ValueError/FileNotFoundError for a bad workdir, step, format, dtype or OUT, and for a model the
    Hugging Face format cannot express (naming the field) before any checkpoint is read."""
    if format not in FORMATS:
        raise ValueError(f"--format {format!r}; choose one of {', '.join(FORMATS)}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    run = Run.open(workdir)
    config, task, cfg, num_labels = run.config.to_dict(), run.task, run.model_config, run.num_labels
    if format == "huggingface":
        if task != "mlm":
            raise ValueError(f"{workdir} is a {task!r} run; the Hugging Face format holds masked-LM runs "
                             "(BertForMaskedLM, AlbertForMaskedLM, ModernBertForMaskedLM); use --format orbax")
        hf_config(cfg)  # refuse what transformers cannot express before reading any checkpoint
    folder = _check_new(out)
    step, params = run.params(step)
    params = cast_params(params, dtype)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = run.tokenizer_file if run.tokenizer_file is not None and run.tokenizer_file.is_file() else None
    if tokenizer is not None:  # inference needs the vocabulary; the file is small
        (folder / tokenizer.name).write_bytes(tokenizer.read_bytes())
    if format == "huggingface":
        save_huggingface(folder, cfg, params)
        if tokenizer is not None:  # what AutoTokenizer.from_pretrained(OUT) reads, with the same ids
            for name, text in transformers_tokenizer_files(tokenizer, cfg.max_length).items():
                (folder / name).write_text(text)
    else:
        (folder / "run_config.json").write_text(json.dumps(config, indent=2))
        save_export(folder, cfg, params, task=task, num_labels=num_labels, step=step,
                    source=run.location, tokenizer=tokenizer.name if tokenizer else None)
    return dict(out=str(folder), format=format, task=task, step=step, dtype=dtype or cfg.param_dtype)


def save_export(out, cfg: ModelConfig, params, *, task: str = "mlm", num_labels: int | None = None,
                step: int | None = None, source: str | None = None, tokenizer: str | None = None) -> None:
    """Writes parameters (a tree of arrays, e.g. from `load_export` or a TrainState's `params`) as an orbax export
    that `load_export` reads. When every floating leaf has one dtype (e.g. after `cast_params`) the config's
    param_dtype becomes it; mixed trees (bf16 layers, float32 position tables) keep the model's own dtypes."""
    folder = checkpoint_path(out)
    floating = {str(x.dtype) for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)}
    dtype = floating.pop() if len(floating) == 1 else None
    if dtype is not None:
        cfg = dataclasses.replace(cfg, param_dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(folder / "params", params)
    meta = dict(format=FORMAT, version=1, task=task, model=json.loads(json.dumps(config_dict(cfg))),
                num_labels=num_labels, step=step, dtype=dtype, source=source, tokenizer=tokenizer)
    (folder / "config.json").write_text(json.dumps(meta, indent=2))  # last: a folder without it is no export


def read_export_config(path: str) -> dict:
    """EXPORT/config.json of an orbax export (task, model, num_labels, step, dtype, source, tokenizer)."""
    config_path = checkpoint_path(path) / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} is missing: is {path!r} a `jaxpos export` folder?")
    try:
        meta = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    if meta.get("format") != FORMAT:
        hint = " (a Hugging Face folder: load it with jaxpos.checkpoints.huggingface)" if "model_type" in meta else ""
        raise ValueError(f"{config_path} is not a jaxpos export{hint}")
    return meta


def load_export(path: str, mesh: jax.sharding.Mesh | jax.sharding.Sharding | None = None
                ) -> tuple[ModelConfig, dict]:
    """(ModelConfig, parameters) of an orbax export, without any optimiser state. The parameters go onto the
    first of jax.devices() (mesh=None), onto a `jax.sharding.Mesh` with axes (data, fsdp, tensor) placed by
    jaxpos.sharding's logical rules (as training places them), or all with one given `jax.sharding.Sharding`.
    Use them with `run_model(meta["task"], cfg, meta["num_labels"])[0].apply({"params": params}, ...)`, where
    meta = read_export_config(path); e.g. BertForMaskedLM(cfg): ids [B, T] -> logits [B, T, V]."""
    meta = read_export_config(path)
    cfg = model_config(meta["model"], saved=True)
    module, init_args = run_model(meta["task"], cfg, meta.get("num_labels"))
    boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *init_args))["params"]
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, _cast_dtype(x.dtype, meta.get("dtype"))),
                            nn.unbox(boxed))
    shardings = placement(boxed, jax.devices()[0] if mesh is None else mesh)
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(checkpoint_path(path) / "params", abstract_like(abstract, shardings))
    return cfg, params


# --- Hugging Face ----------------------------------------------------------------------------------------------------

def _family(cfg: ModelConfig) -> str:
    """modernbert for the modern block (a gated MLP, which BERT and ALBERT lack), albert for shared layers, else
    bert."""
    if cfg.mlp != "plain":
        return "modernbert"
    return "albert" if cfg.share_layers else "bert"


def _refuse(refusals) -> None:
    for refused, what in refusals:
        if refused:
            raise ValueError(f"the Hugging Face format cannot express {what}; export with --format orbax")


# jaxpos's masked-LM special tokens ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4), as ModernBERT's config names them
_MODERNBERT_TOKENS = dict(pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3)


def modernbert_config(cfg: ModelConfig) -> dict:
    """The config.json of the `transformers.ModernBertForMaskedLM` that computes what `cfg`'s BertForMaskedLM
    computes. Raises ValueError naming the field ModernBERT cannot express."""
    pos = cfg.position
    _refuse([(pos.kind != "rope", f"model.position.kind={pos.kind!r} with model.mlp={cfg.mlp!r}: ModernBERT has "
                                  "RoPE (BERT and ALBERT have no gated MLP)")])
    rope = pos.options
    windows = sorted({layer.window for layer in cfg.plan if layer.window is not None})
    _refuse([
        (cfg.num_decoder_layers, f"model.num_decoder_layers={cfg.num_decoder_layers}: an encoder-decoder"),
        (rope.scaling != "none" or rope.fraction != 1.0, "a RoPE length rule or p-RoPE in ModernBERT's config"),
        (any(not layer.positions for layer in cfg.plan), "NoPE layers (ModernBERT rotates every layer)"),
        (len(windows) > 1, f"local layers of several windows {windows} (ModernBERT has one local_attention)"),
        (pos.segment != "none", f"model.position.segment={pos.segment!r}: ModernBERT has no token types"),
        (pos.content_only or pos.position_only, "an analysis switch (content_only, position_only)"),
        (pos.randomized_max_length is not None, "randomized positions"),
        (cfg.layer_norm != "pre", "model.layer_norm='post': ModernBERT is pre-LN"),
        (cfg.first_layer_attention_norm, "model.first_layer_attention_norm=True: ModernBERT's first layer reads "
                                         "the normalised embeddings"),
        (not cfg.embed_layer_norm, "model.embed_layer_norm=False: ModernBERT normalises the embeddings"),
        (cfg.scale_embeddings, "model.scale_embeddings=True"),
        (cfg.embedding_dim is not None, f"model.embedding_dim={cfg.embedding_dim}: factorised embeddings"),
        (cfg.share_layers, "model.share_layers=True"),
        (cfg.causal, "model.causal=True: ModernBERT is bidirectional"),
        (cfg.mlp == "geglu" and cfg.activation == "relu", "a ReLU-gated MLP")])
    layer_types = ["sliding_attention" if cfg.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
    act = _HF_ACTIVATION[cfg.activation]
    return dict(
        model_type="modernbert", architectures=["ModernBertForMaskedLM"], vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model, intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, max_position_embeddings=cfg.max_length,
        hidden_activation="silu" if cfg.mlp == "swiglu" else act, classifier_activation=act,
        norm_eps=cfg.layer_norm_eps, norm_bias=cfg.norm_bias, attention_bias=cfg.use_bias, mlp_bias=cfg.use_bias,
        classifier_bias=cfg.use_bias, decoder_bias=True, local_attention=windows[0] if windows else 2 * cfg.max_length,
        global_attn_every_n_layers=cfg.global_every, layer_types=layer_types,
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=rope.base),
                         "sliding_attention": dict(rope_type="default", rope_theta=rope.local_base or rope.base)},
        tie_word_embeddings=cfg.tie_embeddings, initializer_range=cfg.init_std, embedding_dropout=cfg.dropout,
        mlp_dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, **_MODERNBERT_TOKENS)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of the transformers model that computes what `cfg`'s BertForMaskedLM computes (BERT,
    ALBERT for shared layers, ModernBERT for the modern block). Raises ValueError naming the field whose value
    transformers cannot express."""
    if _family(cfg) == "modernbert":
        return modernbert_config(cfg)
    pos = cfg.position
    refusals = [
        (cfg.num_decoder_layers, f"model.num_decoder_layers={cfg.num_decoder_layers}: an encoder-decoder"),
        (pos.kind != "absolute", f"model.position.kind={pos.kind!r}: BERT and ALBERT have learned absolute input "
                                 "positions only (position.kind='absolute')"),
        (pos.segment == "per_head", "model.position.segment='per_head': DIET's per-head segment attention"),
        (pos.content_only, "model.position.content_only=True (an analysis switch)"),
        (pos.position_only, "model.position.position_only=True (an analysis switch)"),
        (cfg.layer_norm != "post", f"model.layer_norm={cfg.layer_norm!r}: BERT and ALBERT are post-LN"),
        (not cfg.embed_layer_norm, "model.embed_layer_norm=False: BERT and ALBERT normalise the input embeddings"),
        (cfg.scale_embeddings, "model.scale_embeddings=True: BERT and ALBERT do not scale token embeddings"),
        (cfg.embedding_dim is not None and not cfg.share_layers,
         f"model.embedding_dim={cfg.embedding_dim} without share_layers: BERT has no factorised embeddings "
         "(ALBERT has them, with shared layers)"),
        (cfg.causal and cfg.share_layers, "model.causal=True with share_layers: ALBERT is always bidirectional"),
        (not (cfg.use_bias and cfg.norm_bias), "model.use_bias=False or norm_bias=False: BERT and ALBERT have "
                                               "biases"),
        (not cfg.first_layer_attention_norm, "model.first_layer_attention_norm=False"),
        (cfg.local_window is not None, f"model.local_window={cfg.local_window}: BERT and ALBERT have no local "
                                       "layers"),
    ]
    _refuse(refusals)
    family = _family(cfg)
    hf = {key: getattr(cfg, field) for key, (field, _) in CONFIG_FIELDS.items()}
    hf.update(model_type=family, architectures=["AlbertForMaskedLM" if family == "albert" else "BertForMaskedLM"],
              hidden_act=_HF_ACTIVATION[cfg.activation], tie_word_embeddings=cfg.tie_embeddings)
    if not _has_type_embeddings(cfg):  # a zero table stands in for the token types jaxpos does not embed
        hf["type_vocab_size"] = max(cfg.type_vocab_size, 1)
    if family == "albert":
        hf.update(embedding_size=cfg.embed_width, num_hidden_groups=1, inner_group_num=1)
    else:
        hf.update(is_decoder=cfg.causal, position_embedding_type="absolute")
    return hf


def _has_type_embeddings(cfg: ModelConfig) -> bool:
    return cfg.position.segment == "input" and cfg.type_vocab_size > 0


def _at(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def hf_state_dict(params: dict, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Hugging Face *ForMaskedLM tensors {name: array} from `BertForMaskedLM` parameters, by the importer's
    layout (the inverse of jaxpos.checkpoints.huggingface.bert_mlm_params). Raises ValueError for a parameter
    with no Hugging Face counterpart."""
    hf_config(cfg)
    family = _family(cfg)
    params = jax.tree.map(np.asarray, params)
    encoder = dict(params["bert"], encoder=dict(params["bert"]["encoder"]))
    dtype = params["bert"]["token_embed"]["embedding"].dtype
    if not _has_type_embeddings(cfg) and family != "modernbert":  # token types contribute nothing, as in jaxpos
        encoder["type_embed"] = {"embedding": np.zeros((max(cfg.type_vocab_size, 1), cfg.embed_width), dtype)}
    if family == "albert" and "embed_projection" not in encoder["encoder"]:  # E = d: ALBERT projects anyway
        encoder["encoder"]["embed_projection"] = {"kernel": np.eye(cfg.d_model, dtype=dtype),
                                                  "bias": np.zeros(cfg.d_model, dtype)}
    tensors, used = {}, set()
    for tree, prefix, layout, root in ((encoder, ENCODER_PREFIX[family], encoder_layout(cfg, family), ("bert",)),
                                       (params, MLM_HEAD_PREFIX[family], mlm_head_layout(cfg, family), ())):
        for name, path, kind in layout:
            tensors.update(to_hf(_at(tree, path), prefix + name, kind))
            used.add(root + path)
    head = MLM_HEAD_PREFIX[family]
    if family != "modernbert" and not cfg.tie_embeddings:  # BERT's head bias is the decoder's bias, saved under both
        tensors[head + "bias"] = tensors[head + "decoder.bias"]
    for leaf_path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(k.key for k in leaf_path)
        if not any(keys[:len(p)] == p for p in used):
            raise ValueError(f"parameter {'/'.join(keys)} has no Hugging Face counterpart; export with --format orbax")
    return {k: np.ascontiguousarray(v) for k, v in tensors.items()}


def save_huggingface(out, cfg: ModelConfig, params: dict) -> None:
    """Writes OUT/config.json and OUT/model.safetensors (tensors in the parameters' dtype) for
    `transformers.BertForMaskedLM` (`AlbertForMaskedLM` for shared layers, `ModernBertForMaskedLM` for the modern
    block) `.from_pretrained(OUT)`."""
    folder = checkpoint_path(out)
    hf = hf_config(cfg)
    tensors = hf_state_dict(params, cfg)
    hf["dtype"] = str(next(iter(tensors.values())).dtype)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))

