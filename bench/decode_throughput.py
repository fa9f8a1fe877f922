"""Cached beam-search decoding throughput (sentences/s) of the WMT encoder-decoder, per positional mechanism.

    python bench/decode_throughput.py                                   # configs/wmt/base.py, beam 10, batch 64
    python bench/decode_throughput.py --config configs/wmt/tiny.py --kinds none,tisa --batches 1   # CPU smoke

Each mechanism decodes the same random source sentences (lengths uniform in [--min-len, --max-len] tokens,
EOS-terminated) with randomly initialised parameters whose logits of padding, BOS, UNK and EOS are pinned to 0 (below thousands of positive
logits, so never among the beams' candidates): every hypothesis runs to its length limit (a * source length + b,
at most decode.target_width), the same work for every mechanism. Each new query row reads its bias from the layer's table (or
factors) at the decoding step; nothing [T, S] is rebuilt per step. The first batch compiles and is not timed;
sentences/s is over the --batches timed batches.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.config import model_config
from jaxpos.data.translation import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from jaxpos.decoding.translate import Translator
from jaxpos.config.decode import decode_config
from jaxpos.models import EncoderDecoder

KINDS = "none,absolute,sinusoidal,tisa,diet_rel,diet_abs,t5,alibi,rope,shaw"


def load(path: str):
    spec = importlib.util.spec_from_file_location("bench_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def sources(count: int, width: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> np.ndarray:
    """[count, width] random ids (EOS-terminated, 0-padded), lengths uniform in `lengths`."""
    rng = np.random.default_rng(seed)
    out = np.zeros((count, width), np.int32)
    for row in out:
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        row[:n - 1] = rng.integers(4, vocab, n - 1)
        row[n - 1] = EOS_ID
    return out


def never_end(params):
    """The parameters with the logits of the special tokens (padding, unknown, BOS, EOS) pinned to 0."""
    special = jnp.asarray([PAD_ID, UNK_ID, BOS_ID, EOS_ID])
    params = jax.tree.map(lambda x: x, params)  # a copy to edit
    if "output" in params:
        params["output"]["kernel"] = params["output"]["kernel"].at[:, special].set(0.0)
        if "bias" in params["output"]:
            params["output"]["bias"] = params["output"]["bias"].at[special].set(0.0)
    else:
        params["embed"]["embedding"] = params["embed"]["embedding"].at[special].set(0.0)
    return params


def measure(config, kind: str, batches: int, lengths: tuple[int, int]) -> dict:
    config.model.position.kind = kind
    cfg = model_config(config.model)
    dcfg = decode_config(config.decode)
    width = config.data.eval_max_length
    inputs = sources(dcfg.batch_size * (batches + 1), width, cfg.vocab_size, lengths)
    model = EncoderDecoder(cfg)
    params = jax.jit(lambda rng: flax.linen.unbox(model.init(rng, inputs[:1], inputs[:1, :8])["params"]))(
        jax.random.PRNGKey(0))
    params = never_end(params)
    translator = Translator(cfg, params, tokenizer=None, dcfg=dcfg, source_width=width)
    start = time.perf_counter()
    translator.translate_ids(inputs[:dcfg.batch_size])  # compile + one batch
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = translator.translate_ids(inputs[dcfg.batch_size:])
    elapsed = time.perf_counter() - start
    decoded = int(np.sum(out != 0))
    return dict(kind=kind, sentences_per_s=(len(inputs) - dcfg.batch_size) / elapsed,
                tokens_per_s=decoded / elapsed, compile_s=compile_s)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/wmt/base.py")
    parser.add_argument("--kinds", default=KINDS)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--min-len", type=int, default=10)
    parser.add_argument("--max-len", type=int, default=40)
    args = parser.parse_args()
    config = load(args.config)
    dcfg = decode_config(config.decode)
    print(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}  {args.config}: beam {dcfg.beam_size}, "
          f"batch {dcfg.batch_size}, target width {dcfg.target_width}, sources of {args.min_len}-{args.max_len} "
          f"tokens, {args.batches} timed batches")
    print(f"{'mechanism':<12} {'sentences/s':>12} {'tokens/s':>10} {'x none':>7}  note")
    none = None
    for kind in args.kinds.split(","):
        try:
            r = measure(load(args.config), kind, args.batches, (args.min_len, args.max_len))
        except Exception as err:  # noqa: BLE001 - one mechanism failing must not hide the others
            print(f"{kind:<12} {'failed':>12}  {type(err).__name__}: {str(err)[:100]}", flush=True)
            continue
        none = r["sentences_per_s"] if kind == "none" else none
        ratio = f"{none / r['sentences_per_s']:.2f}" if none else "-"
        print(f"{kind:<12} {r['sentences_per_s']:12.1f} {r['tokens_per_s']:10.0f} {ratio:>7}  "
              f"compile {r['compile_s']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
