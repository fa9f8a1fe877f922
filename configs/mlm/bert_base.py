"""BERT-base (L=12, d=768, H=12), seq 512.

    jaxpos train --config configs/mlm/bert_base.py --workdir runs/base --config.model.position.kind=tisa \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True
"""

from jaxpos.config.defaults import mlm_config


def get_config():
    config = mlm_config()
    config.model.update(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072, max_length=512, dtype="bfloat16")
    config.data.update(seq_len=512, vocab_size=30522)
    config.train.update(num_steps=1_000_000, batch_size=256, learning_rate=1e-4, warmup_steps=10_000,
                        max_predictions=80)
    return config
