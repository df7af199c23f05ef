"""Quantization-aware fine-tuning of a classifier with ModelOpt, distilled from its own FP32 form: the last step of
the INT8 ladder (:mod:`pipeline.quantize.ladder`) for the classification task. A library."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from device.errors import MissingDependencyError
from pipeline.quantize.ort import quiet as _quiet
from pipeline.quantize.quantizers import store_weights_as_int8
from pipeline.tasks.classification.images import image_batches, preprocess_of


def quantization_aware_finetune(ctx, path: Path, calibration: np.ndarray) -> Path:
    """Fake-quantizes the FP32 student with ModelOpt (INT8, per-channel weights), fine-tunes it with
    the recipe's ``quantize.qat`` schedule and exports a real INT8 Q/DQ ONNX (int8 weights).

    The fine-tuning distils from the FP32 student itself (soft targets at the distillation
    temperature, no labels): QAT is to recover the FP32 model's function under quantization, and
    training on labels would credit INT8 with an extra epoch of ordinary training.
    """
    import torch

    from pipeline.checkpoint import load_checkpoint
    from pipeline.tasks.classification.losses import kd_loss
    from pipeline.models import fold_batchnorm
    from pipeline.export.onnx import export_onnx
    from pipeline.tasks.classification.train import fit

    try:
        with _quiet("modelopt"):
            import modelopt.torch.quantization as mtq
    except ImportError as err:
        raise MissingDependencyError(f"quantization-aware fine-tuning needs ModelOpt ({err})",
                                     fix="pip install 'edgefold[modelopt]', or set quantize.qat: null") from None
    cfg = ctx.recipe.quantize.qat
    student, _ = load_checkpoint(ctx.manifest.output("distill", "model"))
    reference = student.eval().to(ctx.device)
    model = fold_batchnorm(load_checkpoint(ctx.manifest.output("distill", "model"))[0])

    def calibrate(module):
        with torch.no_grad():
            for start in range(0, len(calibration), 64):
                module(torch.from_numpy(calibration[start : start + 64]))

    with _quiet("modelopt"):
        model = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, calibrate)
    train = image_batches(ctx, "train", cfg.batch_size, shuffle=True, augment=cfg.augment, seed=cfg.seed, drop_last=True)
    temperature = ctx.recipe.distill.temperature

    def loss_fn(logits, batch):
        with torch.no_grad():
            target = reference(batch.x).float()
        return kd_loss(logits, target, batch.labels, temperature, alpha=1.0)

    fit(model, train, cfg, loss_fn, ctx.device, "qat")
    with _quiet("modelopt"):
        export_onnx(model.cpu().eval(), path, preprocess_of(ctx).input_shape(1), ctx.recipe.export.opset)
    store_weights_as_int8(path)
    return path
