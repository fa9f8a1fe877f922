"""The reproduction's `smoke` profile: a first look in minutes on 2 CPU cores (docs/reproduction.md).

    jaxpos reproduce --out runs/smoke --profile smoke

A d = 64 model on 64-token rows of one Bible, 2 seeds, four mechanisms. Its models are judged as untrained where
they are: the verdicts are the full profile's to give.
"""

import ml_collections

from jaxpos.reproduction.profiles import FAST_COMPILE, TINY_ANALYSIS


def get_config():
    return ml_collections.ConfigDict(dict(
        name="smoke", purpose="a first look: a small model, 4 mechanisms, 2 seeds, a few minutes on 2 CPU cores",
        mechanisms=("none", "absolute", "tisa", "diet_rel"), seeds=2,
        model=dict(d_model=64, num_layers=2, num_heads=4, mlp_dim=128, max_length=64, dropout=0.0,
                   attention_dropout=0.0),
        # eval_fraction >= the fine-tuning's dev + test fractions: pretraining never reads their chapters
        data=dict(source="bible", bible_editions=("web",), max_documents=400, eval_fraction=0.2, seq_len=64,
                  vocab_size=2000),
        train=dict(num_steps=240, batch_size=16, learning_rate=3e-3, warmup_fraction=0.05, max_predictions=16),
        finetune_data=dict(max_length=64, offline_train_examples=512, offline_dev_examples=256,
                           offline_test_examples=256, bible_books=tuple(range(1, 11)), bible_dev_fraction=0.1,
                           bible_test_fraction=0.1),
        finetune_train=dict(num_steps=60, batch_size=16, learning_rate=1e-3),
        analysis=dict(TINY_ANALYSIS, probe_length=64, lengths=(16, 32, 64), probe_epochs=4),
        max_sentences=32, probe_examples=128, curve_points=4, analysis_points=2, eval_batches=4, length_tokens=4096,
        xla_flags=FAST_COMPILE))
