"""A tiny modern encoder (ModernBERT's block at laptop scale) on the embedded corpus: pre-LN, GeGLU, no biases,
RoPE, local layers of 32 tokens with every third layer global, 30% masking, a warmup-stable-decay schedule.

    jaxpos train --config configs/mlm/modern_tiny.py --workdir runs/modern_tiny
    jaxpos train --config configs/mlm/modern_tiny.py --workdir runs/modern_tiny_alibi \
        --config.model.position.kind=alibi
"""

from jaxpos.config.defaults import mlm_config, modern_block


def get_config():
    config = mlm_config()
    modern_block(config.model, d_model=128, num_layers=4, num_heads=4, mlp_dim=192, max_length=128, local_window=32)
    config.data.update(seq_len=128, vocab_size=4000, mask_prob=0.3)
    config.train.update(num_steps=900, batch_size=16, learning_rate=2e-3, warmup_fraction=0.05, schedule="wsd",
                        decay_fraction=0.2, weight_decay=0.01, max_predictions=48, log_every=50, eval_every=450,
                        eval_batches=8, checkpoint_every=450)
    return config
