"""The reproduction's `full` profile: the verdicts, every mechanism, 5 seeds (docs/reproduction.md).

    jaxpos reproduce --out runs/full --profile full

The recipe the verdicts are for: configs/mlm/tiny.py (d = 128, L = 2, H = 4, D = 32) on 128-token rows of three
English Bibles (2.8M tokens), 64 rows a step. At 16 rows a step DIET-Rel's held-out loss parts from the
bag-of-words model's between steps 1,000 and 2,000 and learned absolute positions had not parted by step 4,000;
64 rows a step cost a GPU no more time per step (a tiny model is latency-bound) and bring the parting forward, so
4,000 steps leave the slow mechanisms a margin (on an H200, learned absolute positions part by step 1,600).
Fine-tuning: 600 steps of 32 pairs on the paraphrase task. On the word-order task learned absolute positions stay
at chance for 6,000 steps of 32 pairs and learn it after (0.714 at step 18,000 on 2026-11-27; at 1,200 steps of
4,000 pairs, at rates from 3e-4 to 3e-3, no input positions learned it), so it reads all its training pairs for
20,000 steps, at one rate: a grid at that length would triple what is already most of the profile's time.
Sinusoidal positions reached 0.540 at best with it.
"""

import ml_collections

from jaxpos.reproduction.profiles import EVERY_MECHANISM, TINY_ANALYSIS


def get_config():
    return ml_collections.ConfigDict(dict(
        name="full", purpose="the verdicts: every mechanism, 5 seeds; about 1.5 hours of one GPU host (estimated; the "
        "word-order task's 20,000 steps a run are most of it), days on 2 CPU cores",
        mechanisms=EVERY_MECHANISM, seeds=5,
        model=dict(max_length=128),
        data=dict(source="bible", bible_editions=("web", "kjv", "bbe"), seq_len=128, vocab_size=4000),
        train=dict(num_steps=4000, batch_size=64, learning_rate=2e-3, warmup_fraction=0.05, max_predictions=32),
        finetune_data=dict(max_length=128, offline_train_examples=4000, offline_dev_examples=1000,
                           offline_test_examples=1000),
        finetune_train=dict(num_steps=600, batch_size=32, learning_rate=1e-3),
        order_data=dict(offline_train_examples=0), order_train=dict(num_steps=20000, batch_size=32, learning_rate=3e-4),
        analysis=TINY_ANALYSIS, max_sentences=64, probe_examples=1000, curve_points=10, analysis_points=5,
        timing_steps=40))
