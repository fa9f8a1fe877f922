"""The reproduction's `micro` profile, for tests: a d = 32 model (D = 8) on 32-token rows, a few steps.

    jaxpos reproduce --out runs/micro --profile micro
"""

import ml_collections

from jaxpos.reproduction.profiles import FAST_COMPILE


def get_config():
    return ml_collections.ConfigDict(dict(
        name="micro", purpose="tests: a d = 32 model, a few steps", mechanisms=("none", "tisa"), seeds=2,
        model=dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=32, dropout=0.0,
                   attention_dropout=0.0),
        data=dict(source="bible", bible_editions=("web",), max_documents=60, eval_fraction=0.2, seq_len=32,
                  vocab_size=400),
        train=dict(num_steps=12, batch_size=8, learning_rate=3e-3, warmup_fraction=0.1, max_predictions=8),
        finetune_data=dict(max_length=32, offline_train_examples=64, offline_dev_examples=32,
                           offline_test_examples=32, bible_books=(1, 2), bible_dev_fraction=0.1,
                           bible_test_fraction=0.1),
        finetune_train=dict(num_steps=4, batch_size=8, learning_rate=1e-3),
        analysis=dict(num_probe_words=4, probe_length=32, lengths=(8, 16), windows=1, probe_epochs=2,
                      probe_patience=1, probe_learning_rate=3e-3, decomposition_sentences=4),
        max_sentences=16, probe_examples=24, curve_points=2, analysis_points=2, eval_batches=2, timing_steps=3,
        length_tokens=1024, xla_flags=FAST_COMPILE))
