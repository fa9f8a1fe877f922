"""ModernBERT-base's shapes (Warner et al., 2024): 22 layers, d = 768, 12 heads, a GeGLU MLP of 1,152, pre-LN
without biases, local attention over 128 tokens with every third layer global, RoPE at 10,000 in local and 160,000
in global layers, 1,024 tokens a row, 30% of them masked, a warmup-stable-decay schedule; the layers scanned in
groups of three and rematerialised.

    jaxpos train --config configs/mlm/modern_base.py --workdir runs/modern_base \
        --config.data.source=tfds --config.data.data_dir=gs://BUCKET/tfds --config.data.streaming=True
    jaxpos train --config configs/mlm/modern_base.py --workdir runs/modern_alibi --config.model.position.kind=alibi

Size: 149.7 M parameters (149,655,232; 38.7 M of them the 50,368 x 768 token embeddings, tied to the output
layer). Model FLOPs (jaxpos/training/flops.py, forward and backward, 512 rows of 1,024 tokens, 320 predictions a
row): 0.83 GFLOP a token, 0.09 of them attention scores and sums (a local layer's query reads 129 keys).
Memory of the train step, `python bench/scaling.py --skip compile --memory-size modern_base --batch 8 --length 1024`
(XLA's analysis of the compiled step on the CPU, whose XLA path materialises every layer's 1,024 x 1,024 scores;
2026-11-27): 1,713 MiB of parameters, AdamW moments and batch; temporaries 32,914 MiB without remat, 9,516 MiB
with save_projections, 11,190 MiB with save_dots, 7,803 MiB with full. save_projections keeps q, k, v and the
MLP's input: 22% above full's temporaries, 3.5 x below none's, and its backward recomputes the attention and the
GeGLU's input projection only, 43% of the matrix products that full recomputes (each layer's whole forward).
"""

from jaxpos.config.defaults import mlm_config, modern_block


def get_config():
    config = mlm_config()
    # save_projections: the memory table above (and bench/RESULTS.md, "Scanned layers and rematerialisation")
    modern_block(config.model, vocab_size=50368, d_model=768, num_layers=22, num_heads=12, mlp_dim=1152,
                 max_length=1024, dtype="bfloat16", scan_layers=True, remat="save_projections")
    config.data.update(seq_len=1024, vocab_size=50368, mask_prob=0.3)
    # ModernBERT-base's peak learning rate, AdamW betas and weight decay; batch and steps are a single-pod run's
    config.train.update(num_steps=200_000, batch_size=512, learning_rate=8e-4, b2=0.98, weight_decay=1e-5,
                        warmup_steps=6_000, schedule="wsd", decay_fraction=0.1, max_predictions=320)
    return config
