"""EdgeFold checkpoints, read the same way on both sides: state, never pickled modules.

A checkpoint holds the architecture key, the class count, the layer *structure* (channel counts changed by
pruning) and the state_dict, all plain tensors and numbers, so it loads with ``torch.load(weights_only=True)``
and is validated against the architecture it names. The build side writes it (:mod:`pipeline.checkpoint`); the
device reads it when it must export a rung on its own torch (the Torch-TensorRT road: a ``.pt2`` from a newer
torch does not load, and ModelOpt's INT8 export needs CUDA, which the build host may lack).

``folded: true`` marks a network pruned in its inference form (timm's ``reparameterize_model`` applied before
pruning, as FastViT and MobileOne must be): the architecture is built, folded, then narrowed to the structure.

Keys a device checkpoint adds:

* ``architecture``: the architecture's identity (:meth:`device.models.architectures.Architecture.identity`: key, source,
  fingerprint, the package that provides it); the device rebuilds the module only when its own registry has the same
  source and fingerprint, and names the package to install otherwise;
* ``input_chw``: the network input's C×H×W, for the static export at each measured batch;
* ``modelopt``: the INT8 rung of the Torch-TensorRT road, ModelOpt's quantizer state calibrated on the build
  host: ``{"version": modelopt's, "state": mto.modelopt_state(model), "state_dict": the quantized (BatchNorm
  folded) model's state_dict with each quantizer's amax}``. The device rebuilds the student, folds its BatchNorm
  as the build host did (:func:`device.models.architectures.fold_batchnorm`), restores the quantizers
  (``mto.restore_from_modelopt_state``) and loads the state: what ``mto.restore`` does with ``mto.save``'s file
  (modelopt/torch/opt/conversion.py, 0.47.0), from a file ``torch.load(weights_only=True)`` reads.

torch is imported inside the functions: ``device`` imports without it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

from device.models.architectures import ARCHITECTURES, build_model, check_identity, fold_batchnorm
from device.errors import CheckpointError, MissingDependencyError

FORMAT = "edgefold.checkpoint/1"

MAX_WIDTH = 1 << 16  # channels or features of one layer
MAX_CLASSES = 1 << 20
MAX_INPUT_SIZE = 4096  # the side a sized architecture (a timm ViT) is built for: its position embedding grows with it²
# The architecture a checkpoint names may hold at most this many times the parameters its file carries (pruning
# removes far fewer): a small file naming a billion-parameter timm model is refused before anything is allocated.
MAX_UNPRUNED_FACTOR = 64
_CORRUPT = "the checkpoint is corrupt or was edited; re-run the stage that produced it (--force STAGE)"
# Attributes that describe a layer's shape, by layer type name (torch.nn's); pruning rewrites exactly these.
STRUCTURE_ATTRS = {
    "Conv2d": ("in_channels", "out_channels", "groups"),
    "BatchNorm2d": ("num_features",),
    "Linear": ("in_features", "out_features"),
    "LayerNorm": ("normalized_shape",),
}


def _structured_base(module) -> str | None:
    """The torch.nn shaped layer ``module`` is or derives from (timm's ``LayerNorm2d`` is a ``LayerNorm``,
    ``BatchNormAct2d`` a ``BatchNorm2d``), whose width attributes pruning rewrites; None for any other module."""
    from torch import nn

    return next((name for name in STRUCTURE_ATTRS if isinstance(module, getattr(nn, name))), None)


def capture_structure(model) -> dict[str, dict[str, Any]]:
    """The shape-defining attributes of every conv, norm and linear layer."""
    structure = {}
    for name, module in model.named_modules():
        base = _structured_base(module)
        if base is None:
            continue
        structure[name] = {"type": type(module).__name__}
        for attr in STRUCTURE_ATTRS[base]:
            value = getattr(module, attr)
            structure[name][attr] = list(value) if isinstance(value, tuple) else value
    return structure


def apply_structure(model, structure: dict[str, dict[str, Any]], state_dict: dict[str, Any]) -> None:
    """Reshapes ``model`` in place to the recorded (pruned) structure.

    Raises:
        CheckpointError: If a recorded layer is missing or of another type.
    """
    import torch
    from torch import nn

    modules = dict(model.named_modules())
    for name, attrs in structure.items():
        if not isinstance(attrs, dict):
            raise CheckpointError(f"checkpoint layer {name!r} has no recorded attributes", fix=_CORRUPT)
        module = modules.get(name)
        if module is None or type(module).__name__ != attrs.get("type"):
            found = type(module).__name__ if module is not None else "nothing"
            raise CheckpointError(
                f"checkpoint layer {name!r} is a {attrs.get('type')} but the architecture has {found} there",
                fix="the checkpoint was made for another architecture; check the recipe's arch",
            )
        base = _structured_base(module)
        if base is None:  # the class name matched, but it is no shaped layer: nothing of it may be set from a file
            raise CheckpointError(f"checkpoint layer {name!r} records widths for a {attrs['type']}, which has none",
                                  fix=_CORRUPT)
        allowed = STRUCTURE_ATTRS[base]
        for attr, value in attrs.items():
            if attr == "type":
                continue
            # Only the widths pruning changes, each a positive count in reach of a real network: anything else in a
            # file would set arbitrary attributes (a stride or padding that explodes the compute) or allocate freely.
            values = value if isinstance(value, list) else [value]
            if attr not in allowed or not values or not all(type(v) is int and 0 < v <= MAX_WIDTH for v in values):
                raise CheckpointError(f"checkpoint layer {name}.{attr} = {str(value)[:40]} is not a recorded width "
                                      f"(allowed: {', '.join(allowed)}, integers 1..{MAX_WIDTH})", fix=_CORRUPT)
            setattr(module, attr, tuple(value) if isinstance(value, list) else value)
    # Tensors whose saved shape differs are replaced by empty ones of that shape, then filled
    # by load_state_dict; parameters stay parameters so the model still trains.
    for key, saved in state_dict.items():
        module_name, _, tensor_name = key.rpartition(".")
        module = modules.get(module_name)
        current = getattr(module, tensor_name, None) if module is not None else None
        if not isinstance(current, torch.Tensor) or current.shape == saved.shape:
            continue
        # A layer's own parameter (a ConvNeXt block's layer-scale ``gamma``, which Torch-Pruning narrows with its
        # channels) may only have been narrowed: same rank, no dimension wider than the architecture's.
        narrowed = (module_name not in structure and len(saved.shape) == current.dim()
                    and all(0 < new <= old for new, old in zip(saved.shape, current.shape)))
        if module_name in structure or narrowed:
            replacement = torch.empty(saved.shape, dtype=current.dtype)
            if isinstance(current, nn.Parameter):
                setattr(module, tensor_name, nn.Parameter(replacement, requires_grad=current.requires_grad))
            else:
                module.register_buffer(tensor_name, replacement)
    for name in structure:
        _check_layer(name, modules[name])


def _expected_shapes(module) -> dict[str, tuple[int, ...]]:
    from torch import nn

    if isinstance(module, nn.Conv2d):
        shapes = {"weight": (module.out_channels, module.in_channels // module.groups, *module.kernel_size)}
        return {**shapes, "bias": (module.out_channels,)} if module.bias is not None else shapes
    if isinstance(module, nn.BatchNorm2d):
        return {k: (module.num_features,) for k in ("weight", "bias", "running_mean", "running_var")
                if getattr(module, k, None) is not None}
    if isinstance(module, nn.Linear):
        shapes = {"weight": (module.out_features, module.in_features)}
        return {**shapes, "bias": (module.out_features,)} if module.bias is not None else shapes
    if isinstance(module, nn.LayerNorm):
        return {k: tuple(module.normalized_shape) for k in ("weight", "bias") if getattr(module, k, None) is not None}
    return {}


def _check_layer(name: str, module) -> None:
    """A layer's tensors must agree with its recorded channel counts (catches tampered files)."""
    for tensor_name, shape in _expected_shapes(module).items():
        actual = tuple(getattr(module, tensor_name).shape)
        if actual != shape:
            raise CheckpointError(
                f"checkpoint layer {name}.{tensor_name} has shape {actual} but its recorded structure says {shape}",
                fix="the checkpoint is corrupt or was edited; re-run the stage that produced it (--force STAGE)",
            )


def load_state_strict(model, state_dict: dict[str, Any], source: str) -> None:
    """``load_state_dict`` that names the first missing, unexpected or misshapen tensor."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not fit the architecture: missing {missing[:3]}, unexpected {unexpected[:3]}",
            fix="the weights were saved from another architecture; check the recipe's arch",
        )
    for key, tensor in state_dict.items():
        if expected[key].shape != tensor.shape:
            raise CheckpointError(
                f"{source}: layer {key} has shape {tuple(tensor.shape)} but the model expects {tuple(expected[key].shape)}",
                fix="the weights were saved from another architecture or width; check the recipe's arch",
            )
    model.load_state_dict(state_dict)


def torch_load(path: Path, what: str, fix_unsafe: str, fix_corrupt: str) -> Any:
    """``torch.load(weights_only=True)`` with the failure named for what it is.

    torch's own messages for a text file ("101"), a truncated archive ("failed finding central
    directory") and a pickled module ("Weights only load failed") all need different fixes.
    """
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt or unsafe files
        head = path.read_bytes()[:64] if path.stat().st_size else b""
        text = str(err)
        unsafe = "Weights only load failed" in text or "Unsupported global" in text
        if not head:
            problem, fix = "is empty", fix_corrupt
        elif zipfile.is_zipfile(path) or head[:2] == b"PK":
            problem, fix = ((UNSAFE, fix_unsafe) if unsafe else
                            (f"is a damaged torch archive ({text.splitlines()[0][:160]}): truncated or corrupt",
                             fix_corrupt))
        elif head[:1] == b"\x80":  # a legacy (non-zip) torch pickle
            problem, fix = ((UNSAFE, fix_unsafe) if unsafe else
                            (f"is a damaged legacy torch file ({text.splitlines()[0][:160]})", fix_corrupt))
        else:
            sample = head[:24].decode("utf-8", "replace")
            problem = f"is not a torch file (it starts with {sample!r})"
            fix = "pass the file written by torch.save(model.state_dict(), path)"
        raise CheckpointError(f"{what} {problem}", fix=fix) from None


def check_archive(path: Path, what: str, fix: str) -> None:
    """The torch-free check the agent makes at upload (:func:`device.uploads.safe_pickle.check_torch_save`), made again before
    ``torch.load``: torch's weights-only unpickler is the second wall, not the only one. A legacy (non-zip) file is
    left to that unpickler: the pipeline reads users' older state dicts, and the agent accepts only zip archives.

    Raises:
        CheckpointError: The archive's pickle could run code or is not what torch.save of tensors writes.
    """
    from device.uploads.archive_check import ArchiveRefused, check_zip
    from device.uploads.safe_pickle import UnsafePickleError, check_torch_save

    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            check_zip(archive, what)
            check_torch_save(archive)
    except (UnsafePickleError, ArchiveRefused) as err:
        raise CheckpointError(f"{what} refused: {err}", fix=fix) from None
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise CheckpointError(f"{what} is a damaged torch archive ({err})", fix=fix) from None


UNSAFE = "holds pickled Python objects, not only tensors (refused: loading runs code)"


def read_payload(path: str | os.PathLike, fix: str = "re-run the stage that produces it (--force STAGE)",
                 on_device: bool = False) -> dict:
    """The checkpoint's dict, loaded with ``weights_only=True`` and checked to be an EdgeFold checkpoint.

    Args:
        on_device: A device checkpoint read by the device: its recorded architecture identity must be there and
            match what this device would build (:func:`device.models.architectures.check_identity`).

    Raises:
        CheckpointError: Missing, unreadable, unsafe, or not an EdgeFold checkpoint; or an unknown architecture.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist", fix=fix)
    check_archive(path, f"checkpoint {path}", fix)
    payload = torch_load(path, f"checkpoint {path}", fix_unsafe=fix, fix_corrupt=fix)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an EdgeFold checkpoint ({FORMAT})",
                              fix="torchvision state_dicts are passed as WEIGHTS=path, not as a stage checkpoint")
    classes, channels = payload.get("num_classes"), payload.get("in_channels", 3)
    size = payload.get("input_size")
    if type(classes) is not int or not 0 < classes <= MAX_CLASSES or channels not in (1, 3) or (
            size is not None and (type(size) is not int or not 0 < size <= MAX_INPUT_SIZE)):
        raise CheckpointError(f"{path} records {classes!r} classes, {channels!r} input channels and input size "
                              f"{size!r}", fix=_CORRUPT)
    if not isinstance(payload.get("folded", False), bool):
        raise CheckpointError(f"{path} records folded={payload.get('folded')!r}, not true or false", fix=_CORRUPT)
    if on_device:
        identity = payload.get("architecture")
        if isinstance(identity, dict) and identity.get("key") != payload.get("arch"):
            raise CheckpointError(f"{path.name} names architecture {payload.get('arch')!r} but records the identity of "
                                  f"{str(identity.get('key'))[:80]!r}", fix=_CORRUPT)
        check_identity(identity, f"checkpoint {path.name}")
    elif payload.get("arch") not in ARCHITECTURES:
        raise CheckpointError(f"{path} names unknown architecture {payload.get('arch')!r}",
                              fix=ARCHITECTURES.suggest(str(payload.get("arch"))))
    return payload


def model_from_payload(payload: dict, source: str):
    """The float model a checkpoint's dict describes (eval mode, CPU), its pruned widths applied and checked."""
    args = (payload["arch"], payload["num_classes"], int(payload.get("in_channels", 3)))
    _refuse_oversized(payload, args, source)
    model = build_model(*args, input_size=payload.get("input_size"))
    if payload.get("folded"):
        fold = ARCHITECTURES.get(payload["arch"]).inference_form
        if fold is None:
            raise CheckpointError(f"{source} was pruned in the inference form of {payload['arch']}, which this "
                                  "registry's architecture does not have", fix=_CORRUPT)
        model = fold(model)
    state_dict = payload["state_dict"]
    apply_structure(model, payload.get("structure") or {}, state_dict)
    load_state_strict(model, state_dict, source)
    return model.eval()


def _refuse_oversized(payload: dict, args: tuple, source: str) -> None:
    """Builds the named architecture on the meta device (no memory) and refuses one far larger than the file."""
    import torch

    try:
        with torch.device("meta"):
            probe = build_model(*args, input_size=payload.get("input_size"))
    except (RuntimeError, NotImplementedError):  # a builder that reads values while it builds (.item() on meta)
        return
    full = sum(p.numel() for p in probe.parameters())
    state = payload.get("state_dict")
    held = sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor)) if isinstance(state, dict) else 0
    if full > MAX_UNPRUNED_FACTOR * held + (1 << 20):
        raise CheckpointError(f"{source} names {payload['arch']} ({full / 1e6:.1f} M parameters) but holds "
                              f"{held / 1e6:.2f} M values: more than {MAX_UNPRUNED_FACTOR}× what pruning removes",
                              fix=_CORRUPT)


def load_checkpoint(path: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """Loads and validates a checkpoint.

    Returns:
        The model (eval mode, on CPU) and the checkpoint's metadata (``arch``, ``num_classes``, ``meta``, ``folded``:
        the model is already in its inference form).

    Raises:
        CheckpointError: Missing file, not a checkpoint, unknown architecture, or shapes that do not fit the
            recorded structure.
    """
    payload = read_payload(path)
    model = model_from_payload(payload, str(path))
    return model, {"arch": payload["arch"], "num_classes": payload["num_classes"], "meta": payload.get("meta", {}),
                   "folded": bool(payload.get("folded"))}


def modelopt_modules():
    """ModelOpt's ``opt`` and ``quantization`` modules, or a :class:`MissingDependencyError` saying what to install."""
    try:
        import modelopt.torch.opt as mto
        import modelopt.torch.quantization as mtq
    except ImportError as err:
        raise MissingDependencyError(f"the Torch-TensorRT road's INT8 rung needs NVIDIA ModelOpt ({err})",
                                     fix="pip install 'edgefold[modelopt]' (on JetPack 6: make bundle or docker-jetson "
                                         "with TORCH_TENSORRT=1), or leave torch_tensorrt out of deploy.runtimes") \
            from None
    return mto, mtq


# What ModelOpt's quantize and calibrate modes write for a TensorQuantizer (modelopt/torch/quantization/nn/modules/
# tensor_quantizer.py get_modelopt_state, 0.47.0): ``restore_quantizer_state`` sets each key as an attribute of the
# quantizer, so only these keys, with values of these kinds, reach it.
_FLAGS = {"_disabled", "_if_quant", "_if_calib", "_fake_quant", "_dynamic", "_dequantize", "_narrow_range", "_unsigned",
          "_learn_amax", "_rotate", "_pass_through_bwd", "_use_constant_amax", "_enable_pre_quant_scale"}
QUANTIZER_KEYS = _FLAGS | {"_num_bits", "_axis", "_effective_bits", "_input_dtype", "_trt_high_precision_dtype",
                           "_constant_amax", "_bias", "_block_sizes", "backend", "backend_extra_args",
                           "_pytorch_state_metadata"}
QUANTIZER_BUFFERS = {"_amax", "_pre_quant_scale", "_bias_value"}
MODELOPT_MODES = {"quantize", "max_calibrate", "mse_calibrate"}
_QUANTIZER_NAME = ("input_quantizer", "weight_quantizer", "output_quantizer")
_CALIBRATORS = {None, "max", "histogram"}


def check_modelopt_state(modelopt: Any, model, source: str) -> None:
    """Refuses, by name, anything in a checkpoint's ModelOpt state that ModelOpt's INT8 modes do not write: modes other
    than quantize and max/mse calibration, quantizers on modules the student lacks, quantizer keys or values of other
    kinds, buffers other than a quantizer's amax and scales. ``model`` is the float student the state is for.

    Raises:
        CheckpointError: Naming the mode, quantizer, key or value.
    """
    import torch

    fix = "re-run the quantize stage: edgefold run … --force quantize"

    def refuse(what: str):
        raise CheckpointError(f"{source}: ModelOpt state refused: {what}", fix=fix)

    if not isinstance(modelopt, dict) or set(modelopt) != {"version", "state", "state_dict"}:
        refuse("the modelopt entry must hold version, state and state_dict only")
    state = modelopt["state"]
    if not isinstance(state, dict) or set(state) != {"modelopt_state_dict", "modelopt_version"}:
        refuse(f"state keys {sorted(state) if isinstance(state, dict) else type(state).__name__}, not "
               "modelopt_state_dict and modelopt_version")
    modes = state["modelopt_state_dict"]
    if not isinstance(modes, (list, tuple)) or not modes:
        refuse("modelopt_state_dict is not a list of modes")
    modules = {name for name, _ in model.named_modules()}
    for entry in modes:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], dict)):
            refuse("a mode entry is not (name, state)")
        mode, mode_state = entry
        if mode not in MODELOPT_MODES:
            refuse(f"mode {str(mode)[:60]!r} (EdgeFold's INT8 rung writes {', '.join(sorted(MODELOPT_MODES))})")
        if set(mode_state) - {"config", "metadata"}:
            refuse(f"mode {mode} holds {sorted(set(mode_state) - {'config', 'metadata'})}")
        _check_plain_config(mode_state.get("config"), f"mode {mode} config", refuse)
        metadata = mode_state.get("metadata") or {}
        if not isinstance(metadata, dict) or set(metadata) - {"quantizer_state"}:
            refuse(f"mode {mode} metadata holds {sorted(metadata) if isinstance(metadata, dict) else metadata!r}")
        quantizers = metadata.get("quantizer_state") or {}
        if not isinstance(quantizers, dict):
            refuse(f"mode {mode}: quantizer_state is not a mapping")
        for name, quantizer in quantizers.items():
            parent, _, leaf = str(name).rpartition(".")
            if leaf not in _QUANTIZER_NAME or parent not in modules:
                refuse(f"quantizer {str(name)[:80]!r} is not an input, weight or output quantizer of a layer of the "
                       "student")
            _check_quantizer(quantizer, str(name), refuse, torch)


def _check_plain_config(config: Any, where: str, refuse, depth: int = 0) -> None:
    """A mode's config: plain values only, no backend or custom calibrator (ModelOpt resolves those to code)."""
    if depth > 8:
        refuse(f"{where} nests deeper than 8 levels")
    if isinstance(config, dict):
        for key, value in config.items():
            if not isinstance(key, str):
                refuse(f"{where} has a key of type {type(key).__name__}")
            if key == "calibrator" and value not in _CALIBRATORS:
                refuse(f"{where}: calibrator {str(value)[:60]!r} (max or histogram)")
            if key in ("backend", "backend_extra_args") and value not in (None, {}):
                refuse(f"{where}: {key} {str(value)[:60]!r} (a custom quantization backend)")
            if key == "parent_class" and value is not None and not (
                    isinstance(value, str) and value.startswith("nn.") and value[3:].isidentifier()):
                refuse(f"{where}: parent_class {str(value)[:60]!r} (torch.nn classes only)")
            _check_plain_config(value, f"{where}.{key}", refuse, depth + 1)
    elif isinstance(config, (list, tuple)):
        for item in config:
            _check_plain_config(item, where, refuse, depth + 1)
    elif not (config is None or isinstance(config, (str, int, float, bool))):
        refuse(f"{where} holds a {type(config).__name__}")


def _check_quantizer(quantizer: Any, name: str, refuse, torch) -> None:
    if not isinstance(quantizer, dict):
        refuse(f"quantizer {name} is a {type(quantizer).__name__}")
    unknown = sorted(set(quantizer) - QUANTIZER_KEYS)
    if unknown:
        refuse(f"quantizer {name} sets {', '.join(map(str, unknown[:5]))}, which ModelOpt's TensorQuantizer state does "
               "not hold")

    def ints(value, most: int = 8) -> bool:
        values = value if isinstance(value, (list, tuple)) else [value]
        return len(values) <= most and all(type(v) is int and -8 <= v <= MAX_WIDTH for v in values)

    checks = {
        "_num_bits": lambda v: ints(v, 2) and v not in (0, []),
        "_axis": lambda v: v is None or ints(v, 4),
        "_effective_bits": lambda v: v is None or ints(v, 1),
        "_input_dtype": lambda v: v is None or isinstance(v, torch.dtype),
        "_trt_high_precision_dtype": lambda v: v in ("Float", "Half", "BFloat16"),
        "_constant_amax": lambda v: v is None or type(v) in (int, float),
        "_bias": lambda v: v is None or (isinstance(v, dict) and all(ints(k, 1) or isinstance(k, str) for k in v)),
        "_block_sizes": lambda v: v is None or (isinstance(v, dict) and all(
            (type(k) is int and ints(x, 1)) or (k in ("type", "scale_bits", "scale_block_sizes")) for k, x in v.items())),
        "backend": lambda v: v is None,
        "backend_extra_args": lambda v: v in (None, {}),
        "_pytorch_state_metadata": lambda v: _state_metadata_ok(v, torch),
    }
    for key, value in quantizer.items():
        ok = type(value) is bool if key in _FLAGS else checks[key](value)
        if not ok:
            refuse(f"quantizer {name}: {key} = {str(value)[:60]!r} is not what ModelOpt writes there")


def _state_metadata_ok(value: Any, torch) -> bool:
    if not (isinstance(value, dict) and set(value) <= {"params", "buffers"} and value.get("params", {}) == {}):
        return False
    buffers = value.get("buffers", {})
    return isinstance(buffers, dict) and all(
        name in QUANTIZER_BUFFERS and isinstance(meta, dict) and set(meta) == {"shape", "dtype"}
        and isinstance(meta["dtype"], torch.dtype) and isinstance(meta["shape"], (tuple, list, torch.Size))
        and len(meta["shape"]) <= 4 and all(type(d) is int and 0 < d <= MAX_WIDTH for d in meta["shape"])
        for name, meta in buffers.items())


def restore_quantized(model, modelopt: dict, source: str):
    """``model`` (the float student) folded as the build host folded it, with ModelOpt's quantizers restored from
    ``modelopt`` (the checkpoint's ``modelopt`` key) and their amax loaded: fake-quantized, eval mode.

    Raises:
        CheckpointError: The state does not fit this student.
        MissingDependencyError: ModelOpt is not installed.
    """
    mto, _ = modelopt_modules()
    fix = "re-run the quantize stage: edgefold run … --force quantize"
    folded = fold_batchnorm(model.eval().cpu())
    check_modelopt_state(modelopt, folded, source)  # ModelOpt sets each quantizer key as an attribute
    try:
        restored = mto.restore_from_modelopt_state(folded, modelopt["state"])
        load_state_strict(restored, modelopt["state_dict"], f"{source} (ModelOpt state)")
    except CheckpointError as err:  # the quantized weights or amax do not fit the restored quantizers
        raise CheckpointError(err.message, fix=fix) from None
    except (AssertionError, KeyError, TypeError, ValueError, RuntimeError) as err:  # ModelOpt checks with assert too
        raise CheckpointError(f"{source} holds no ModelOpt quantizer state that fits this student ({err!r})",
                              fix=fix) from None
    return restored.eval()


def load_for_export(path: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """The module a device exports from a checkpoint: the float student, or with a ``modelopt`` key, the student
    with ModelOpt's INT8 quantizers restored.

    Returns:
        The module (CPU, eval) and ``{"arch", "source", "quantized", "input_chw", "modelopt"}`` (the architecture's
        recorded source; ModelOpt's version that calibrated, or None).
    """
    payload = read_payload(path, fix="send the checkpoint the pipeline's export or quantize stage wrote", on_device=True)
    model = model_from_payload(payload, str(path))
    modelopt = payload.get("modelopt")
    if modelopt is not None:
        model = restore_quantized(model, modelopt, str(path))
    chw = payload.get("input_chw")
    return model, {"arch": payload["arch"], "source": payload["architecture"]["source"],
                   "quantized": modelopt is not None,
                   "input_chw": tuple(int(d) for d in chw) if chw else None,
                   "modelopt": (modelopt or {}).get("version")}
