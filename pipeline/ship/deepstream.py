"""The DeepStream ``nvinfer`` config of a shipped rung, and the graph ``nvinfer`` runs.

``nvinfer`` scales the whole frame (or object) to the network's size, then feeds ``y = net-scale-factor * (x -
offsets[c])`` per pixel (Gst-nvinfer, "pre-processing function"). It has no shorter-side resize and centre crop, and
one scale for every channel. So the shipped DeepStream graph takes the normalisation ``nvinfer`` cannot: where the
standard deviation differs per channel, the config scales by 1/255 and subtracts 255·mean, and a ``Mul`` by 1/std per
channel is put in front of the network. A classifier's graph ends in a ``Softmax``: ``nvinfer``'s default classifier
parser reads probabilities and EdgeFold's graphs end in logits.

:data:`NVINFER_KEYS` holds the keys of the ``[property]`` group that NVIDIA documents, each with the values it takes,
from the Gst-nvinfer page's "Gst-nvinfer File Configuration Specifications" (DeepStream 9.2,
https://docs.nvidia.com/metropolis/deepstream/dev-guide/text/DS_plugin_gst-nvinfer.html) and the key names of
``gstnvinfer_property_parser.h`` there; a written config is checked against it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np


def _int_in(*values: int) -> Callable[[str], bool]:
    return lambda text: bool(re.fullmatch(r"-?\d+", text)) and int(text) in values


def _int_at_least(low: int) -> Callable[[str], bool]:
    return lambda text: bool(re.fullmatch(r"\d+", text)) and int(text) >= low


def _float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _floats(text: str) -> bool:
    return bool(text) and all(_float(part) for part in text.split(";"))


def _path(text: str) -> bool:
    return bool(text) and "\n" not in text


def _dims(text: str) -> bool:
    return bool(re.fullmatch(r"\d+;\d+;\d+", text))


_BOOL = _int_in(0, 1)

# The [property] keys of Gst-nvinfer's configuration file (the page above), each with the values it takes. A key
# EdgeFold never writes still checks as documented, so the table is the page's, not EdgeFold's.
NVINFER_KEYS: dict[str, Callable[[str], bool]] = {
    "num-detected-classes": _int_at_least(1),
    "net-scale-factor": lambda t: _float(t) and float(t) > 0,
    "model-file": _path, "proto-file": _path, "int8-calib-file": _path, "onnx-file": _path,
    "model-engine-file": _path, "tlt-encoded-model": _path, "tlt-model-key": _path, "mean-file": _path,
    "labelfile-path": _path, "custom-lib-path": _path,
    "batch-size": _int_at_least(1),
    "gpu-id": _int_at_least(0),
    "network-mode": _int_in(0, 1, 2, 3),  # 0 FP32, 1 INT8, 2 FP16, 3 BEST
    "offsets": _floats,
    "output-blob-names": lambda t: bool(t),
    "output-tensor-meta": _BOOL,
    "network-type": _int_in(0, 1, 2, 3, 100),  # detector, classifier, segmentation, instance segmentation, other
    "model-color-format": _int_in(0, 1, 2),  # RGB, BGR, GRAY
    "scaling-filter": _int_at_least(0),  # NvBufSurfTransform_Inter: 0 nearest, 1 bilinear, …
    "scaling-compute-hw": _int_in(0, 1, 2),
    "infer-dims": _dims,
    "maintain-aspect-ratio": _BOOL,
    "symmetric-padding": _BOOL,
    "process-mode": _int_in(1, 2),  # primary (whole frame), secondary (objects)
    "interval": _int_at_least(0),
    "gie-unique-id": _int_at_least(1),
    "operate-on-gie-id": _int_at_least(1),
    "operate-on-class-ids": lambda t: bool(re.fullmatch(r"\d+(;\d+)*", t)),
    "filter-out-class-ids": lambda t: bool(re.fullmatch(r"\d+(;\d+)*", t)),
    "classifier-threshold": lambda t: _float(t) and 0 <= float(t) <= 1,
    "segmentation-threshold": lambda t: _float(t) and 0 <= float(t) <= 1,
    "segmentation-output-order": _int_in(0, 1),  # NCHW, NHWC
    "parse-segmentation-func-name": lambda t: bool(t), "output-instance-mask": _BOOL,
    "classifier-async-mode": _BOOL,
    "secondary-reinfer-interval": _int_at_least(0),
    "input-object-min-width": _int_at_least(0), "input-object-min-height": _int_at_least(0),
    "input-object-max-width": _int_at_least(0), "input-object-max-height": _int_at_least(0),
    "parse-bbox-func-name": lambda t: bool(t), "parse-classifier-func-name": lambda t: bool(t),
    "engine-create-func-name": lambda t: bool(t),
    "cluster-mode": _int_in(0, 1, 2, 3, 4),
    "workspace-size": _int_at_least(1),
    "enable-dla": _BOOL, "use-dla-core": _int_at_least(0),
    "network-input-order": _int_in(0, 1),
    "force-implicit-batch-dim": _BOOL,
    "disable-output-host-copy": _BOOL,
    "crop-objects-to-roi-boundary": _BOOL,
    "output-io-formats": lambda t: bool(t), "layer-device-precision": lambda t: bool(t),
    "dump-input-tensor": _BOOL, "dump-output-tensor": _BOOL,
}
NETWORK_MODE = {"fp32": 0, "int8": 1, "fp16": 2}
COLOR_FORMAT = {3: 0, 1: 2, "bgr": 1}  # RGB (EdgeFold's channel order), GRAY; BGR for a model trained so
SCALING_FILTER = {"nearest": 0, "bilinear": 1}  # NvBufSurfTransform_Inter


def normalization(preprocess: dict[str, Any]) -> tuple[float, list[float], list[float] | None]:
    """(net-scale-factor, offsets, the per-channel 1/std the graph must apply or None) for ``nvinfer`` to feed what
    EdgeFold's preprocessing feeds: (x/255 - mean) / std."""
    mean, std = [float(m) for m in preprocess["mean"]], [float(s) for s in preprocess["std"]]
    offsets = [round(255.0 * m, 6) for m in mean]
    if len(set(std)) == 1:
        return 1.0 / (255.0 * std[0]), offsets, None
    return 1.0 / 255.0, offsets, [1.0 / s for s in std]


def deepstream_model(source: Path, target: Path, per_channel: list[float] | None, softmax: bool) -> dict[str, Any]:
    """Writes the graph ``nvinfer`` runs: ``source`` with a per-channel ``Mul`` in front (when the standard deviation
    differs per channel) and a ``Softmax`` at the end (a classifier's logits to probabilities).

    Returns:
        What was changed, for the card.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    changed = []
    if per_channel is not None:
        name = graph.input[0].name
        scaled = f"{name}__edgefold_std"
        for node in graph.node:
            node.input[:] = [scaled if value == name else value for value in node.input]
        scale = numpy_helper.from_array(np.asarray(per_channel, np.float32).reshape(1, -1, 1, 1),
                                        f"{name}__edgefold_inv_std")
        graph.initializer.append(scale)
        graph.node.insert(0, helper.make_node("Mul", [name, scale.name], [scaled], name="edgefold_inv_std"))
        changed.append("a Mul by 1/std per channel before the network (nvinfer scales all channels alike)")
    if softmax:
        output = graph.output[0]
        logits = f"{output.name}__edgefold_logits"
        for node in graph.node:
            node.output[:] = [logits if value == output.name else value for value in node.output]
        graph.node.append(helper.make_node("Softmax", [logits], [output.name], axis=1, name="edgefold_softmax"))
        changed.append("a Softmax over the class axis after the logits (nvinfer's classifier and segmentation "
                       "parsers read probabilities)")
    if output_type(model) != TensorProto.FLOAT:
        raise ValueError("the DeepStream graph's output must be float32")
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return {"changes": changed}


def output_type(model) -> int:
    return model.graph.output[0].type.tensor_type.elem_type


def config_text(keys: dict[str, Any], class_attributes: dict[str, Any] | None = None) -> str:
    """The ``config_infer.txt`` text: ``[property]`` (every key checked against :data:`NVINFER_KEYS`) and an optional
    ``[class-attrs-all]`` group.

    Raises:
        ValueError: A key NVIDIA does not document, or a value it does not take.
    """
    lines = ["[property]"]
    for key, value in keys.items():
        text = ";".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        check = NVINFER_KEYS.get(key)
        if check is None or not check(text):
            raise ValueError(f"nvinfer key {key}={text!r} is not one the Gst-nvinfer page documents with that value")
        lines.append(f"{key}={text}")
    if class_attributes:
        lines += ["", "[class-attrs-all]"] + [f"{key}={value}" for key, value in class_attributes.items()]
    return "\n".join(lines) + "\n"


def parse_config(text: str) -> dict[str, dict[str, str]]:
    """The groups and keys of a ``config_infer.txt`` (GLib's key file format: ``[group]`` then ``key=value``)."""
    groups: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = groups.setdefault(line[1:-1], {})
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return groups
