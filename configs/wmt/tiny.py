"""A tiny encoder-decoder on the offline Bible corpus (Elberfelder 1905 -> World English Bible), for 2 CPUs.

3,000 steps, then beam 4 over the 809 test sentences (test SacreBLEU 25.9, TISA); 1,000 steps with 200 test
sentences reach 13.7. The README gives the measured durations of both.

    jaxpos train --config configs/wmt/tiny.py --workdir runs/wmt_tiny --config.model.position.kind=diet_rel
    jaxpos train --config configs/wmt/tiny.py --workdir runs/wmt_quick --config.train.num_steps=1000 \
        --config.train.test_sentences=200              # the quick variant; test_bleu=False skips the final decode
    jaxpos eval-bleu --workdir runs/wmt_tiny          # all 809 test sentences; --max-sentences N for fewer
    echo "Im Anfang war das Wort." | jaxpos translate --workdir runs/wmt_tiny

Every mechanism trains on packed rows (several pairs a row, each at its own positions); --config.data.pack=False
gives one pair per row.
"""

from jaxpos.config.defaults import translation_config


def get_config():
    config = translation_config()
    config.model.update(vocab_size=4000, d_model=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                        mlp_dim=512, max_length=128, dropout=0.1, attention_dropout=0.0)
    config.model.position.kind = "tisa"
    config.data.update(source="bible", max_length=64, eval_max_length=128, vocab_size=4000)
    config.train.update(num_steps=3000, batch_size=32, learning_rate=2e-3, warmup_steps=300, log_every=50,
                        eval_every=1000, eval_batches=10, checkpoint_every=500, bleu_every=0,
                        bleu_sentences=200)
    config.decode.update(beam_size=4, alpha=0.6, target_width=128, batch_size=64)
    return config
