"""BERT-large (L=24, d=1024, H=16), seq 512, its 24 layers as one scanned layer with the projections saved for
the backward pass (model.remat=save_projections).

    jaxpos train --config configs/mlm/bert_large.py --workdir runs/large --config.model.position.kind=diet_rel \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True

Memory (XLA's analysis of the compiled step, bench/scaling.py, 2026-11-27 on the CPU, which plans as a GPU does
not): about 1.3 GiB of parameters and 2.7 GiB of AdamW state in float32 (335M parameters), plus the step's
activations, which remat trades for compute: see bench/RESULTS.md, "Scanned layers and rematerialisation".
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
