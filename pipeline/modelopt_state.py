"""ModelOpt's PyTorch INT8 quantizer state for the Torch-TensorRT road: calibrated here, restored on the device.

ModelOpt's INT8 export through ``torch.export`` needs CUDA tensors (on CPU its quantizers keep the legacy
fake-quant that ``torch.export`` rejects), so the build host ships the student's checkpoint plus the quantizer
state (``mto.save``: ``modelopt_state`` and the state dict with each quantizer's amax), calibrated on the same
calibration images as the ONNX road; the device restores it (``mto.restore``), exports under ModelOpt's
``export_torch_mode`` and compiles. On CPU the restored model runs with fake quantization: that is what the
accuracy gate scores here.

The recipe's calibration methods map onto ModelOpt's PyTorch algorithms (:data:`MODELOPT_METHODS`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from device.errors import CheckpointError, MissingDependencyError

# Recipe method → ModelOpt algorithm (modelopt/torch/quantization/config.py, 0.47.0: MaxCalibConfig "max",
# MseCalibConfig "mse"). ModelOpt's PyTorch algorithms have no entropy or percentile: "mse" (the amax that
# minimises the quantization error, searched from max) is the nearest — like them it clips outliers that max keeps.
MODELOPT_METHODS = {"max": "max", "entropy": "mse", "percentile": "mse"}


def _modelopt():
    try:
        import modelopt.torch.opt as mto
        import modelopt.torch.quantization as mtq
    except ImportError as err:
        raise MissingDependencyError(f"the Torch-TensorRT road's INT8 rung needs ModelOpt ({err})",
                                     fix="pip install 'edgefold[modelopt]', or leave torch_tensorrt out of "
                                         "deploy.runtimes") from None
    return mto, mtq


def prepare(model: torch.nn.Module) -> torch.nn.Module:
    """The student as both sides quantize it: eval mode, BatchNorm folded into its Conv (as the ONNX export does),
    so the quantizers see the weights TensorRT runs."""
    from pipeline.models import fold_batchnorm

    return fold_batchnorm(model.eval().cpu())


def calibrate(model: torch.nn.Module, calibration: np.ndarray, path: Path, method: str = "max") -> dict:
    """Inserts ModelOpt's INT8 quantizers into ``prepare(model)``, calibrates them on ``calibration`` and saves the
    quantizer state with the weights (``mto.save``) to ``path``, with a JSON record beside it.

    Returns:
        The record: ModelOpt's algorithm, the recipe method it stands for, versions, quantizer count.
    """
    import copy

    mto, mtq = _modelopt()
    import modelopt

    config = copy.deepcopy(mtq.INT8_DEFAULT_CFG)
    config["algorithm"] = MODELOPT_METHODS[method]
    prepared = prepare(model)

    def forward_loop(module) -> None:
        with torch.no_grad():
            for start in range(0, len(calibration), 64):
                module(torch.from_numpy(calibration[start : start + 64]))

    quantized = mtq.quantize(prepared, config, forward_loop)
    mto.save(quantized, str(path))
    quantizers = [name for name, module in quantized.named_modules() if type(module).__name__ == "TensorQuantizer"]
    record = {"method": method, "modelopt_algorithm": MODELOPT_METHODS[method], "modelopt": modelopt.__version__,
              "torch": torch.__version__, "calibration_images": int(len(calibration)), "batchnorm_folded": True,
              "quantizers": len(quantizers), "config": "mtq.INT8_DEFAULT_CFG"}
    Path(f"{path}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def restore(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """``model`` (a fresh student from its checkpoint) prepared as :func:`calibrate` did, with the saved quantizer
    state and weights restored (``mto.restore``): fake-quantized on CPU."""
    mto, _ = _modelopt()
    try:
        return mto.restore(prepare(model), str(path)).eval()
    except (KeyError, TypeError, ValueError) as err:  # ModelOpt's own checks of the file's dict
        raise CheckpointError(f"{path} holds no ModelOpt quantizer state that fits this student ({err!r})",
                              fix="re-run the quantize stage: edgefold run … --force quantize") from None
