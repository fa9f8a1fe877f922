"""Long-context masked LM: BERT-base (L=12, d=768, H=12) at 4,096 tokens a row with ALiBi, a Toeplitz table that
the fast attention path takes without an n x n bias (attention_impl=auto picks the table kernel on Hopper GPUs,
the XLA reference elsewhere), the layers scanned and fully rematerialised: a layer keeps only its input for the
backward pass, so activation memory grows with L x B x T x d, not with the attention's T x T.

    jaxpos train --config configs/mlm/long_context.py --workdir runs/long \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True

Memory (XLA's analysis of the compiled step on the CPU, whose XLA path materialises the T x T scores, 2026-11-27):
1.2 GiB of parameters and AdamW moments, and at 2 x 4,096 tokens a device 6.7 GiB of temporaries with full remat
against 51.5 GiB without; bench/RESULTS.md, "Scanned layers and rematerialisation".
ALiBi is inductive, so a run evaluates at other lengths too (`jaxpos evaluate --lengths`).
"""

from jaxpos.config.defaults import mlm_config


def get_config():
    config = mlm_config()
    config.model.update(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072, max_length=4096, dtype="bfloat16",
                        scan_layers=True, remat="full")
    config.model.position.kind = "alibi"
    config.data.update(seq_len=4096, vocab_size=30522)
    config.train.update(num_steps=200_000, batch_size=32, learning_rate=1e-4, warmup_steps=5_000, max_predictions=640)
    return config
