"""BERT's GLUE fine-tuning recipe (Devlin et al. 2019): AdamW at 2e-5, batch 32, 3 epochs, 10% warmup, dropout
0.1, 128 tokens; dev scores at every epoch (evals.json keeps each, for the maximum over checkpoints).

    jaxpos finetune --config configs/finetune/glue.py --init runs/bert_small --workdir runs/ft/mrpc \
        --config.data.task=mrpc --config.data.source=glue_dir --config.data.glue_dir=/data/glue
    jaxpos finetune --config configs/finetune/glue.py --init /models/bert-base-uncased --workdir runs/ft/sst2 \
        --config.data.task=sst2 --config.data.source=tfds
    jaxpos finetune-sweep --config configs/finetune/glue.py --init tisa=runs/tisa --init rel=runs/diet_rel \
        --tasks mrpc,rte,stsb --seeds 0,1,2,3,4 --learning-rates 2e-5,3e-5,5e-5 --out runs/sweep \
        --config.data.source=glue_dir --config.data.glue_dir=/data/glue
"""

from jaxpos.config.defaults import finetune_config


def get_config():
    config = finetune_config()
    config.model.dtype = "bfloat16"  # float32 parameters; bf16 compute on accelerators (the CPU emulates it)
    return config
