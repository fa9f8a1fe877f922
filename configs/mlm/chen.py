"""Chen, Varoquaux & Suchanek's masked-LM recipe (A.2): BERT-base, seq 512, batch 64, Adam lr 5e-4,
betas (0.9, 0.999), weight decay 0.01, warmup 10%, dropout 0.1, 600k steps; the learnable attenuated encoding
shared across the heads of a layer (BERT-A*-s).

    jaxpos train --config configs/mlm/chen.py --workdir runs/chen \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True
    # BERT-A* (per head):  --config.model.position.attenuated.sharing=none
"""

from jaxpos.config.defaults import mlm_config, set_position


def get_config():
    config = mlm_config()
    config.model.update(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072, max_length=512, dropout=0.1,
                        attention_dropout=0.1, dtype="bfloat16")
    set_position(config.model, "attenuated", form="matrix", sharing="head")
    config.data.update(seq_len=512, vocab_size=30522)
    config.train.update(num_steps=600_000, batch_size=64, optimizer="adamw", learning_rate=5e-4, b1=0.9,
                        b2=0.999, weight_decay=0.01, warmup_fraction=0.1, schedule="linear", max_predictions=80)
    return config
