"""BERT-large (L=24, d=1024, H=16), seq 512, its 24 layers as one scanned layer with the projections saved for
the backward pass (model.remat=save_projections).

    jaxpos train --config configs/mlm/bert_large.py --workdir runs/large --config.model.position.kind=diet_rel \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True

Memory (XLA's analysis of the compiled step, `python bench/scaling.py --skip compile --memory-size bert_large`,
2026-11-27, on the CPU, whose plan a GPU's need not match): 3.7 GiB of float32 parameters and AdamW moments (335M
parameters), and, at 8 x 512 tokens a device, 4.0 GiB of temporaries with the projections saved (19.9 GiB
without remat, 2.6 GiB with full remat): see bench/RESULTS.md, "Scanned layers and rematerialisation".
"""

from jaxpos.config.defaults import mlm_config


def get_config():
    config = mlm_config()
    config.model.update(d_model=1024, num_layers=24, num_heads=16, mlp_dim=4096, max_length=512, dtype="bfloat16",
                        scan_layers=True, remat="save_projections")
    config.data.update(seq_len=512, vocab_size=30522)
    config.train.update(num_steps=1_000_000, batch_size=256, learning_rate=1e-4, warmup_steps=10_000,
                        max_predictions=80)
    return config
