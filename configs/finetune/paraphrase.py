"""Fine-tuning a small model on the offline Bible paraphrase task (`pip install 'jaxpos[bible]'`): verse pairs of
two editions, paraphrase or not, balanced; 4,000 training and 1,000 dev pairs (0 takes all: 178,088 / 3,518).
Chance is 0.5.

    jaxpos train --config configs/mlm/tiny.py --workdir runs/tiny --config.data.source=bible
    jaxpos finetune --config configs/finetune/paraphrase.py --init runs/tiny --workdir runs/tiny_paraphrase
"""

from jaxpos.config.defaults import finetune_config


def get_config():
    config = finetune_config()
    config.data.update(task="bible_paraphrase", source="offline", max_length=128, offline_train_examples=4000,
                       offline_dev_examples=1000, offline_test_examples=1000)
    config.train.update(num_steps=600, batch_size=32, learning_rate=1e-3, warmup_fraction=0.1, log_every=50,
                        eval_every=200)
    return config
