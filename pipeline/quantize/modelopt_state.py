"""ModelOpt's PyTorch INT8 quantizer state for the Torch-TensorRT road: calibrated here, restored on the device.

ModelOpt's INT8 export through ``torch.export`` needs CUDA tensors (on CPU its quantizers keep the legacy
fake-quant that ``torch.export`` rejects), so the build host ships one file: the student's checkpoint with the
quantizer state beside its weights (``modelopt``: ``mto.modelopt_state`` and the quantized state dict with each
quantizer's amax; :mod:`device.uploads.torch_checkpoint`), calibrated on the same calibration images as the ONNX road.
The device restores it, exports under ModelOpt's ``export_torch_mode`` and compiles
(:mod:`device.runners.torch_tensorrt`). On CPU the restored model runs with fake quantization: that is what the
accuracy gate scores here, restored by the device's own code from the file the device gets.

The recipe's calibration methods map onto ModelOpt's PyTorch algorithms (:data:`MODELOPT_METHODS`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from device.models.architectures import ARCHITECTURES, fold_batchnorm
from device.files import atomic_writer
from device.uploads.torch_checkpoint import load_for_export, model_from_payload, modelopt_modules, read_payload

# Recipe method → ModelOpt algorithm (modelopt/torch/quantization/config.py, 0.47.0: MaxCalibConfig "max",
# MseCalibConfig "mse"). ModelOpt's PyTorch algorithms have no entropy or percentile: "mse" (the amax that
# minimises the quantization error, searched from max) is the nearest — like them it clips outliers that max keeps.
MODELOPT_METHODS = {"max": "max", "entropy": "mse", "percentile": "mse"}


def calibrate(checkpoint: Path, calibration: np.ndarray, path: Path, method: str = "max",
              input_chw: Sequence[int] | None = None) -> dict:
    """Inserts ModelOpt's INT8 quantizers into the checkpoint's student (BatchNorm folded, as the ONNX export does,
    so the quantizers see the weights TensorRT runs), calibrates them on ``calibration`` and writes the device
    checkpoint (the student's own checkpoint plus ``modelopt`` and ``input_chw``) to ``path``, with a JSON record
    beside it.

    Returns:
        The record: ModelOpt's algorithm, the recipe method it stands for, versions, quantizer count.
    """
    import copy

    mto, mtq = modelopt_modules()
    import modelopt

    payload = read_payload(checkpoint)
    config = copy.deepcopy(mtq.INT8_DEFAULT_CFG)
    config["algorithm"] = MODELOPT_METHODS[method]
    prepared = fold_batchnorm(model_from_payload(payload, str(checkpoint)))

    def forward_loop(module) -> None:
        with torch.no_grad():
            for start in range(0, len(calibration), 64):
                module(torch.from_numpy(calibration[start : start + 64]))

    quantized = mtq.quantize(prepared, config, forward_loop)
    chw = list(input_chw) if input_chw is not None else list(calibration.shape[1:])
    device_checkpoint = {**payload, "input_chw": [int(d) for d in chw],
                         "architecture": ARCHITECTURES.get(payload["arch"]).identity(),
                         "modelopt": {"version": modelopt.__version__, "state": mto.modelopt_state(quantized),
                                      "state_dict": {k: v.detach().cpu().contiguous()
                                                     for k, v in quantized.state_dict().items()}}}
    with atomic_writer(path) as handle:
        torch.save(device_checkpoint, handle)
    quantizers = [name for name, module in quantized.named_modules() if type(module).__name__ == "TensorQuantizer"]
    record = {"method": method, "modelopt_algorithm": MODELOPT_METHODS[method], "modelopt": modelopt.__version__,
              "torch": torch.__version__, "calibration_images": int(len(calibration)), "batchnorm_folded": True,
              "quantizers": len(quantizers), "config": "mtq.INT8_DEFAULT_CFG", "input_chw": chw}
    Path(f"{path}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def restore(path: Path) -> torch.nn.Module:
    """The student with its quantizers restored from the device checkpoint at ``path``, as the device restores it
    (:func:`device.uploads.torch_checkpoint.load_for_export`): fake-quantized on CPU.

    Raises:
        CheckpointError: ``path`` is no device checkpoint with ModelOpt's state that fits its student.
    """
    from device.errors import CheckpointError

    model, facts = load_for_export(path)
    if not facts["quantized"]:
        raise CheckpointError(f"{path} holds no ModelOpt quantizer state (a float checkpoint)",
                              fix="re-run the quantize stage: edgefold run … --force quantize")
    return model
