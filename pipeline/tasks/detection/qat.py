"""Quantization-aware fine-tuning of a detector with ModelOpt: the last step of the INT8 ladder
(:mod:`pipeline.quantize.ladder`) for the detection task.

The student is fake-quantized (INT8, per-channel weights) with the box-regression branch left unquantized unless the
recipe quantizes it (``quantize.box_head: int8``), calibrated on the calibration canvases, then fine-tuned to give
what its FP32 form gives: the loss is the mean squared difference of the raw head outputs (class logits, box deltas,
centre-ness for every anchor), with no labels. As for a classifier's QAT, the point is to recover the FP32 function
under quantization; training on boxes would credit INT8 with extra ordinary training. The result is exported as the
FP32 student was (:func:`pipeline.tasks.detection.export.export_detector`) and its weights stored as int8. A library.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import MissingDependencyError
from pipeline.quantize.ort import quiet as _quiet
from pipeline.quantize.quantizers import store_weights_as_int8
from pipeline.train import engine

# ModelOpt's quantizer names follow module paths: every quantizer inside the box-regression branch.
BOX_BRANCH_QUANTIZERS = "*regression_head*"


def detector_qat(checkpoint: Path, out: Path, calibration: np.ndarray, train_inputs: np.ndarray, cfg,
                 box_head: str, opset: int, postprocess: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fine-tunes the detector in ``checkpoint`` under fake quantization and writes its INT8 Q/DQ ONNX to ``out``
    (with the decoding sidecar beside it).

    Args:
        checkpoint: The FP32 student (the distill stage's).
        calibration: Network inputs (N×3×S×S in [0, 1]) the quantizers are calibrated on.
        train_inputs: Network inputs the fine-tuning runs over.
        cfg: The recipe's ``quantize.qat`` (epochs, batch size, optimizer, learning rate, weight decay, clip, seed).
        box_head: ``int8`` quantizes the box branch too; otherwise it stays float (the caller writes it FP16).

    Returns:
        Facts to record: steps, the last loss, which quantizers were left off.
    """
    import torch

    from pipeline.tasks.detection.checkpoint import load_detector
    from pipeline.tasks.detection.export import RawHead, export_detector
    from pipeline.tasks.detection.models import DETECTORS

    try:
        with _quiet("modelopt"):
            import modelopt.torch.quantization as mtq
    except ImportError as err:
        raise MissingDependencyError(f"quantization-aware fine-tuning needs ModelOpt ({err})",
                                     fix="pip install 'edgefold[modelopt]', or set quantize.qat: null") from None
    torch.manual_seed(cfg.seed)
    student, meta = load_detector(checkpoint)
    reference = RawHead(copy.deepcopy(student).eval()).eval()
    folded = fold_sequential_batchnorm(student.eval())
    wrapped = RawHead(student)
    config = copy.deepcopy(mtq.INT8_DEFAULT_CFG)
    if box_head != "int8":
        rules = config["quant_cfg"]
        if isinstance(rules, list):  # ModelOpt ≥ 0.4x: ordered entries, a later one overrides an earlier
            rules.append({"quantizer_name": BOX_BRANCH_QUANTIZERS, "enable": False})
        else:  # older releases: a dict from pattern to settings
            rules[BOX_BRANCH_QUANTIZERS] = {"enable": False}

    def calibrate(module):
        with torch.no_grad():
            for start in range(0, len(calibration), 32):
                module(torch.from_numpy(calibration[start : start + 32]))

    with _quiet("modelopt"):
        wrapped = mtq.quantize(wrapped, config, calibrate)
    batches = engine.InputBatches(torch.from_numpy(train_inputs), cfg.batch_size, cfg.seed)

    def step(model, x, device, memory_format) -> engine.Step:
        x = x.to(device).contiguous(memory_format=memory_format)
        with torch.no_grad():
            target = reference(x)
        return engine.Step(torch.nn.functional.mse_loss(model(x), target), len(x))

    # Statistics stay the FP32 student's (frozen_norms): only the weights learn the rounding.
    history = engine.fit(wrapped, batches, cfg, step, torch.device("cpu"), "qat", frozen_norms=True)
    detector = wrapped.eval().detector
    with _quiet("modelopt"):
        export_detector(detector, out, meta["arch"], meta["input_size"], DETECTORS.get(meta["arch"]).label_offset,
                        opset, postprocess)
    converted = store_weights_as_int8(out)
    return {"qat_steps": math.ceil(cfg.epochs * len(batches)), "qat_history": history, "weights_int8": converted,
            "box_branch_quantized": box_head == "int8", "batchnorm_folded": folded}


def fold_sequential_batchnorm(model) -> int:
    """Folds every BatchNorm2d that directly follows a Conv2d inside an ``nn.Sequential`` into that convolution, in
    place (eval mode); returns how many.

    Before fake quantization, as the classifier's QAT does (:func:`device.models.architectures.fold_batchnorm`): otherwise the
    weight quantizers see unfolded weights and the exported graph keeps a BatchNorm after each INT8 convolution. A
    detector cannot be traced whole (its transform and post-processing branch on data), so only what a Sequential's
    order makes certain is folded; torchvision's detection backbones are built of such blocks.
    """
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = 0
    for parent in list(model.modules()):
        if not isinstance(parent, nn.Sequential):
            continue
        names = list(parent._modules)
        for first, second in zip(names, names[1:]):
            conv, norm = parent._modules[first], parent._modules[second]
            if isinstance(conv, nn.Conv2d) and type(norm) is nn.BatchNorm2d and conv.out_channels == norm.num_features:
                parent._modules[first] = fuse_conv_bn_eval(conv.eval(), norm.eval())
                parent._modules[second] = nn.Identity()
                folded += 1
    return folded
