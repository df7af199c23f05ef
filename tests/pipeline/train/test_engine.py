"""The training engine's numeric settings: the fused optimizer step, and bf16 autocast on a CPU only where the recipe
asks for it and the CPU computes bf16 natively (a real short fit on the digits data, through the classifier's step)."""

import numpy as np
import pytest
import torch

from device.models.architectures import build_model
from device.preprocess import Preprocess
from pipeline.tasks.classification.batches import Batches
from pipeline.core.data.sources import load_source
from pipeline.core.recipe import TrainConfig
from pipeline.tasks.classification import train
from pipeline.train import engine

PRE = Preprocess(input_size=16, resize=16, channels=3, mean=(0.3, 0.3, 0.3), std=(0.4, 0.4, 0.4))


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_optimizer_steps_with_one_fused_kernel_and_the_same_update(optimizer):
    model = torch.nn.Linear(8, 3)
    cfg = TrainConfig(epochs=1, lr=0.1, optimizer=optimizer, weight_decay=0.01)
    fused = engine.make_optimizer(model, cfg)
    assert all(group["fused"] for group in fused.param_groups)
    # The same update as the per-tensor loop, to rounding.
    twin = torch.nn.Linear(8, 3)
    twin.load_state_dict(model.state_dict())
    looped = engine.make_optimizer(twin, cfg)
    for group in looped.param_groups:
        group["fused"], group["foreach"] = False, True
    x = torch.randn(16, 8)
    for net, opt in ((model, fused), (twin, looped)):
        for _ in range(3):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    torch.testing.assert_close(model.weight, twin.weight, rtol=1e-5, atol=1e-6)


def test_bf16_on_a_cpu_only_when_asked_and_native(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(engine, "cpu_bf16", lambda: "amx_bf16")
    assert engine.amp_dtype(TrainConfig(epochs=1, lr=0.1, amp="bf16"), cpu) is torch.bfloat16
    assert engine.amp_dtype(TrainConfig(epochs=1, lr=0.1), cpu) is None, "auto keeps a CPU in fp32"
    monkeypatch.setattr(engine, "cpu_bf16", lambda: None)  # an AVX2 host: bf16 would be emulated, slower
    assert engine.amp_dtype(TrainConfig(epochs=1, lr=0.1, amp="bf16"), cpu) is None


@pytest.mark.parametrize("native", [None, "avx512_bf16"])
def test_each_epoch_records_the_precision_it_trained_in(monkeypatch, native):
    monkeypatch.setattr(engine, "cpu_bf16", lambda: native)
    split = load_source("digits").train
    batches = Batches(split, np.arange(64), PRE, batch_size=32, shuffle=True, seed=0)
    model = build_model("tiny_resnet", 10)
    cfg = TrainConfig(epochs=1, lr=0.01, amp="bf16", channels_last=False)
    history = train.fit(model, batches, cfg, lambda logits, batch: torch.nn.functional.cross_entropy(
        logits, batch.labels), torch.device("cpu"), "test")
    assert history[0]["autocast"] == ("bfloat16" if native else "fp32")
    assert np.isfinite(history[0]["loss"]) and next(model.parameters()).dtype is torch.float32


@pytest.mark.parametrize("chosen", [False, True])
def test_the_network_trains_in_the_memory_format_chosen_whatever_the_batches_strides(chosen):
    """Batches are made from HWC images (NHWC strides) and the evaluation between epochs leaves the weights
    channels_last: without care a run with channels_last off trained channels_last anyway, and on a CPU timm's
    FastViT then took over a minute a step (0.4 s in NCHW). Every convolution now sees the chosen format."""
    split = load_source("digits").train
    batches = Batches(split, np.arange(64), PRE, batch_size=32, shuffle=True, seed=0)
    x = next(iter(batches))[0]
    assert not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last), "the batches are NHWC"
    model = build_model("tiny_resnet", 10)
    seen = []

    def record(module, args):
        if module.training:
            fmt = torch.channels_last if chosen else torch.contiguous_format
            seen.append(args[0].is_contiguous(memory_format=fmt) and module.weight.is_contiguous(memory_format=fmt))

    for conv in (m for m in model.modules() if isinstance(m, torch.nn.Conv2d)):
        conv.register_forward_pre_hook(record)
    cfg = TrainConfig(epochs=2, lr=0.01, channels_last=chosen)
    train.fit(model, batches, cfg, lambda logits, batch: torch.nn.functional.cross_entropy(logits, batch.labels),
              torch.device("cpu"), "test", evaluate_fn=lambda: train.evaluate(model, batches, torch.device("cpu")))
    assert seen and all(seen)
