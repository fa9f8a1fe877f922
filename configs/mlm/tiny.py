"""Tiny BERT with TISA on the embedded corpus: the README demo, 900 steps (the README gives measured durations).

    jaxpos train --config configs/mlm/tiny.py --workdir runs/tiny
    jaxpos train --config configs/mlm/tiny.py --workdir runs/tiny_rel --config.model.position.kind=diet_rel
"""

from jaxpos.config.defaults import mlm_config


def get_config():
    config = mlm_config()
    config.model.update(d_model=128, num_layers=2, num_heads=4, mlp_dim=256, max_length=128,
                        dropout=0.1, attention_dropout=0.1)
    config.model.position.kind = "tisa"
    config.data.update(seq_len=128, vocab_size=4000)
    config.train.update(num_steps=900, batch_size=16, learning_rate=2e-3, warmup_fraction=0.05,
                        weight_decay=0.01, max_predictions=32, log_every=50, eval_every=450, eval_batches=8,
                        checkpoint_every=450)
    return config
