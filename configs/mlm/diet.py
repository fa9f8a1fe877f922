"""DIET's masked-LM recipe (Chen et al., App. A): BERT-base, seq 128, batch 4096, lr 1.8e-3, warmup 2.5%,
500k steps, no next-sentence loss; DIET-Abs with layer-wise sharing and per-head segment attention.

    jaxpos train --config configs/mlm/diet.py --workdir runs/diet \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True
    # DIET-Rel instead:  --config.model.position.kind=diet_rel
"""

from jaxpos.config.defaults import mlm_config, set_position


def get_config():
    config = mlm_config()
    config.model.update(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072, max_length=128, dtype="bfloat16")
    set_position(config.model, "diet_abs", sharing="layer")
    config.model.position.segment = "per_head"
    config.data.update(seq_len=128, vocab_size=30522)
    config.train.update(num_steps=500_000, batch_size=4096, optimizer="lamb", learning_rate=1.8e-3,
                        warmup_fraction=0.025, schedule="linear", max_predictions=20)
    return config
