"""BERT-small (d=512, L=4, H=8, as in DIET's cost table), seq 128.

    jaxpos train --config configs/mlm/bert_small.py --workdir runs/small \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True
"""

from jaxpos.config.defaults import mlm_config


def get_config():
    config = mlm_config()
    config.model.update(d_model=512, num_layers=4, num_heads=8, mlp_dim=2048, max_length=512,
                        dtype="bfloat16")
    config.data.update(seq_len=128, vocab_size=30522)
    config.train.update(num_steps=100_000, batch_size=256, learning_rate=1e-3, warmup_fraction=0.025,
                        max_predictions=32)
    return config
