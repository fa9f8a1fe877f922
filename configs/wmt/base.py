"""Vaswani base encoder-decoder on WMT18 (DIET section 4.3): 6+6 layers, d=512, H=8, beam 10, alpha 0.6.

    jaxpos train --config configs/wmt/base.py --workdir runs/wmt18_de_en_tisa \
        --config.model.position.kind=tisa --config.data.source=tfds \
        --config.data.tfds_name=wmt18_translate/de-en --config.data.data_dir=/data/tfds
    jaxpos eval-bleu --workdir runs/wmt18_de_en_tisa   # newstest2018, SacreBLEU with its signature

For en -> de, swap the sides: --config.data.source_lang=en --config.data.target_lang=de.
"""

from jaxpos.config.defaults import translation_config


def get_config():
    config = translation_config()
    config.model.update(max_length=256, dtype="bfloat16")
    config.data.update(source="tfds", tfds_name="wmt18_translate/de-en", max_length=256, eval_max_length=256,
                       vocab_size=32000, tokenizer_max_sentences=10_000_000)
    config.train.update(num_steps=250_000, batch_size=256, warmup_steps=4000, bleu_every=10_000,
                        bleu_sentences=0, eval_every=5_000, eval_batches=0, checkpoint_every=5_000,
                        log_every=100)
    config.decode.update(beam_size=10, alpha=0.6, target_width=256, batch_size=64)
    return config
