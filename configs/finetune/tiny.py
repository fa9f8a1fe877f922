"""Fine-tuning the tiny demo model (`make demo`, configs/mlm/tiny.py) on the offline word-order task: no download
(the README gives its measured duration). Chance (0.333) is printed beside the dev accuracy; the TISA demo model
reaches 0.54. The labels depend on word order, so `jaxpos probe-word-order` (which needs a task whose labels do
not) refuses this task: give it an MRPC or RTE run (docs/finetuning.md).

    make demo                                                      # runs/demo
    jaxpos finetune --config configs/finetune/tiny.py --init runs/demo --workdir runs/demo_ft
    jaxpos evaluate --workdir runs/demo_ft
"""

from jaxpos.config.defaults import finetune_config


def get_config():
    config = finetune_config()
    config.data.update(task="word_order", source="offline", max_length=64)
    config.train.update(num_steps=600, batch_size=32, learning_rate=1e-3, warmup_fraction=0.1, log_every=50,
                        eval_every=200)
    return config
