"""Hugging Face `BertForMaskedLM` (bert-base config), torch.compile, bf16 autocast, SDPA, fused AdamW, dropout 0.

    python bench/train_throughput.py --kinds none --peers huggingface   # measured beside jaxpos
"""

from __future__ import annotations

import statistics

import numpy as np


def measure(batch_size: int, seq_len: int, steps: int, data: list[dict], size: dict | None = None) -> dict:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    if not torch.cuda.is_available():
        raise RuntimeError("the Hugging Face peer needs a CUDA device")
    shape = {} if size is None else dict(hidden_size=size["d_model"], num_hidden_layers=size["num_layers"],
                                         num_attention_heads=size["num_heads"], intermediate_size=size["mlp_dim"])
    config = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        max_position_embeddings=max(512, seq_len), **shape)
    try:
        model = BertForMaskedLM._from_config(config, attn_implementation="sdpa")
    except (TypeError, ValueError):
        model = BertForMaskedLM(config)
    model = model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    compiled = torch.compile(model)

    def tensors(batch):
        labels = np.where(batch["mask_weights"] > 0, batch["targets"], -100)
        return [torch.as_tensor(np.asarray(x, np.int64)).cuda()
                for x in (batch["input_ids"], batch["token_types"], labels)]

    batches = [tensors(b) for b in data]

    def step(ids, types, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(input_ids=ids, token_type_ids=types, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for i in range(3):
        step(*batches[i % 2])
    torch.cuda.synchronize()
    times = []
    for i in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step(*batches[i % 2])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    return dict(system="Hugging Face", ms=ms, tokens_per_s=batch_size * seq_len / ms * 1e3, loss=float(loss),
                attention=getattr(model.config, "_attn_implementation", "?"), torch=torch.__version__)

