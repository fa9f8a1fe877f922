"""Fine-tuning a tiny model (`make demo`, configs/mlm/tiny.py) on the offline word-order task: no download, a few
minutes on 2 CPU cores. Chance is printed beside the dev accuracy.

    jaxpos train --config configs/mlm/tiny.py --workdir runs/tiny
    jaxpos finetune --config configs/finetune/tiny.py --init runs/tiny --workdir runs/tiny_ft
    jaxpos evaluate --workdir runs/tiny_ft
    jaxpos probe-word-order --workdir runs/tiny_ft
"""

from jaxpos.config.defaults import finetune_config


def get_config():
    config = finetune_config()
    config.data.update(task="word_order", source="offline", max_length=64)
    config.train.update(num_steps=600, batch_size=32, learning_rate=1e-3, warmup_fraction=0.1, log_every=50,
                        eval_every=200)
    return config
