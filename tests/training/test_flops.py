"""Model FLOPs of a training step against XLA's own count of the compiled forward and backward pass (the matrix
products dominate both: within a few percent, and a missing term or factor shows), the accelerators' peak table,
and the throughput the loop logs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from jaxpos.config import model_config
from jaxpos.models import BertForMaskedLM, BertForSequenceClassification, EncoderDecoder
from jaxpos.training.finetune import ClassificationTask
from jaxpos.training.flops import peak_tflops, throughput
from jaxpos.training.mlm import MaskedLMTask
from jaxpos.training.translation import TranslationTask

SIZES = dict(d_model=256, num_layers=2, num_heads=4, mlp_dim=1024, dropout=0.0, attention_dropout=0.0,
             attention_impl="xla", position=dict(kind="none"))
BATCH, LENGTH = 4, 128


def xla_flops(task, batch) -> float:
    """FLOPs XLA counts in the compiled gradient of the task's loss (forward and backward)."""
    args, kwargs = task.init_inputs()
    params = nn.unbox(task.model.init(jax.random.PRNGKey(0), *args, **kwargs)["params"])
    grad = jax.jit(jax.grad(lambda p: task.loss(p, batch, None, False)[0]))
    cost = grad.lower(params).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def ones(*shape, dtype=jnp.int32):
    return jnp.ones(shape, dtype)


@pytest.mark.parametrize("predicted", [LENGTH, 20])
def test_masked_lm_step_flops_against_xla(predicted):
    task = MaskedLMTask(BertForMaskedLM(model_config(dict(SIZES, vocab_size=1000, max_length=LENGTH))), LENGTH,
                        0 if predicted == LENGTH else predicted)
    batch = dict(input_ids=ones(BATCH, LENGTH), targets=ones(BATCH, LENGTH), mask_weights=ones(BATCH, LENGTH,
                 dtype=jnp.float32), piece_ids=ones(BATCH, LENGTH), token_types=ones(BATCH, LENGTH) * 0)
    assert 1.0 <= xla_flops(task, batch) / task.step_flops(BATCH) < 1.06


def test_translation_step_flops_against_xla():
    cfg = model_config(dict(SIZES, vocab_size=1000, max_length=LENGTH, num_decoder_layers=2))
    task = TranslationTask(EncoderDecoder(cfg), LENGTH, 64, label_smoothing=0.0)
    batch = dict(inputs=ones(BATCH, LENGTH), targets=ones(BATCH, 64))
    assert 1.0 <= xla_flops(task, batch) / task.step_flops(BATCH) < 1.06


def test_classification_step_flops_against_xla():
    cfg = model_config(dict(SIZES, vocab_size=1000, max_length=LENGTH))
    task = ClassificationTask(BertForSequenceClassification(cfg, 3), LENGTH)
    batch = dict(input_ids=ones(BATCH, LENGTH), piece_ids=ones(BATCH, LENGTH), token_types=ones(BATCH, LENGTH) * 0,
                 labels=jnp.zeros(BATCH))
    assert 1.0 <= xla_flops(task, batch) / task.step_flops(BATCH) < 1.06


def test_peaks_and_throughput():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
    assert peak_tflops("NVIDIA H200", "float16") == 989.0 and peak_tflops("TPU v5 lite", "bfloat16") == 197.0
    assert peak_tflops("NVIDIA H200", "float32") is None and peak_tflops("cpu", "bfloat16") is None
    on_h200 = throughput(989e12 * 4 * 0.5, 1.0, devices=4, device_kind="NVIDIA H200", dtype="bfloat16")
    assert on_h200 == pytest.approx(dict(tflops_per_device=494.5, mfu=0.5))
    assert throughput(1e12, 0.5, devices=1, device_kind="cpu") == dict(tflops_per_device=2.0)
    assert throughput(None, 0.5) == {}


def test_the_loop_logs_model_tflops_per_device(tmp_path):
    from tests.training import synthetic

    result = synthetic.run(str(tmp_path), 10, checkpoint_every=10)
    task_flops = MaskedLMTask(BertForMaskedLM(model_config(synthetic.config(10).model)),
                              synthetic.SEQ).step_flops(synthetic.BATCH)
    metrics = result.final_metrics
    assert metrics["tflops_per_device"] == pytest.approx(task_flops / metrics["step_time"] / 1e12)
    assert "mfu" not in metrics  # no known peak for a CPU
