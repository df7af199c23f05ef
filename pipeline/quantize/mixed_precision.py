"""The INT8 ladder's mixed-precision step: which layers' quantization costs the most, and the fewest of them kept out
of INT8 (FP16 in the graph) that bring the candidate within the accuracy budget. A library: the ladder calls it.

Sensitivity is measured leave-one-out on a calibrated candidate: for each quantized layer (a node that reads a
DequantizeLinear: a convolution, a matrix product, a residual add), the candidate with only that layer's Q/DQ taken
away — its activation inputs read from before their QuantizeLinear, its weights the FP32 model's — is run by ONNX
Runtime on a held-out slice and compared with the FP32 model's outputs by the task's distortion (KL of the logits,
or the normalised error of a detector's raw heads). What a layer "buys back" is the candidate's distortion minus the
variant's: what leaving that layer in float returns. TensorRT fuses a convolution with its bias and activation, and
the graph ONNX Runtime's quantizer writes has Q/DQ only at those fused layers' inputs, so a quantized node here is a
fused TensorRT layer. The quantizer itself (``nodes_to_exclude``) then writes the real candidates; the number kept
out, k, is found by bisection on the held-out slice, never on the test split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from device.errors import StageError

QUANTIZATION_OPS = ("QuantizeLinear", "DequantizeLinear")
# The layers a quantizer's nodes_to_exclude acts on (ONNX Runtime and ModelOpt both quantize these); an activation
# that reads a DequantizeLinear only follows its producer's output quantization.
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Add")


@dataclass(frozen=True)
class LayerSensitivity:
    """One quantized layer's leave-one-out sensitivity.

    Attributes:
        layer: The node's name (the same in the FP32 graph and every candidate).
        op_type: Conv, Gemm, MatMul, Add …
        macs: Multiply-accumulates per image it costs in float (0 for an elementwise add).
        distortion: The candidate's distortion with only this layer left in float.
        bought_back: The candidate's distortion minus ``distortion``: what leaving it in float returns.
    """

    layer: str
    op_type: str
    macs: int
    distortion: float
    bought_back: float

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "op_type": self.op_type, "macs": self.macs, "distortion": self.distortion,
                "bought_back": self.bought_back}


def quantized_layers(model) -> list[str]:
    """The names of the convolutions, matrix products and adds that read a DequantizeLinear (the layers quantization
    touches), in graph order."""
    producers = {out: node for node in model.graph.node for out in node.output}
    names = []
    for node in model.graph.node:
        if node.op_type not in COMPUTE_OPS:
            continue
        if any(getattr(producers.get(name), "op_type", None) == "DequantizeLinear" for name in node.input):
            names.append(node.name)
    return names


def layer_macs(model) -> dict[str, int]:
    """Multiply-accumulates per image of each Conv, Gemm and MatMul with a constant weight (shapes inferred by ONNX;
    the batch dimension left out); other nodes count 0."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    shapes = {value.name: [d.dim_value for d in value.type.tensor_type.shape.dim]
              for value in [*graph.value_info, *graph.input, *graph.output]}
    weights = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    macs: dict[str, int] = {}
    for node in graph.node:
        out = shapes.get(node.output[0]) if node.output else None
        weight = weights.get(node.input[1]) if len(node.input) > 1 else None
        if not out or weight is None or any(d <= 0 for d in out[1:]):
            macs[node.name] = 0
        elif node.op_type == "Conv":
            macs[node.name] = math.prod(out[1:]) * math.prod(weight[1:])
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            macs[node.name] = math.prod(out[1:]) * weight[1 if trans_b else 0]
        elif node.op_type == "MatMul" and len(weight) >= 2:
            macs[node.name] = math.prod(out[1:]) * weight[-2]
        else:
            macs[node.name] = 0
    return macs


def dequantized(candidate, fp32, names: Sequence[str]):
    """A copy of ``candidate`` with the named layers' quantization taken away, as the quantizer's ``nodes_to_exclude``
    leaves them: each activation input read from before its QuantizeLinear, each weight stored as int8 replaced by
    the FP32 model's, the layer's output read without its Q/DQ. Other consumers of a shared Q/DQ pair keep it; nodes
    nothing reads any more are dropped.

    Raises:
        StageError: A name is not a node of the candidate, or the FP32 graph lacks it (not the same network).
    """
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(candidate)
    graph = model.graph
    nodes = {node.name: node for node in graph.node}
    fp32_nodes = {node.name: node for node in fp32.graph.node}
    fp32_weights = {tensor.name: tensor for tensor in fp32.graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    present = {tensor.name for tensor in graph.initializer}
    for name in names:
        node = nodes.get(name)
        if node is None or name not in fp32_nodes:
            raise StageError(f"layer {name!r} is not a node of {'the candidate' if node is None else 'the FP32 model'}",
                             fix="name a layer from the sensitivity ranking (quantize metrics: sensitivity)")
        for index, value in enumerate(node.input):
            dequantize = producers.get(value)
            if getattr(dequantize, "op_type", None) != "DequantizeLinear":
                continue
            quantize = producers.get(dequantize.input[0])
            if getattr(quantize, "op_type", None) == "QuantizeLinear":
                node.input[index] = quantize.input[0]
                continue
            original = fp32_nodes[name].input[index]
            if original not in fp32_weights:
                raise StageError(f"layer {name!r}: its input {index} is an int8 weight the FP32 model does not hold "
                                 f"as an initializer ({original!r})",
                                 fix="the candidate and the FP32 model are not the same network; re-run quantize")
            if original + ".fp32" not in present:
                restored = onnx.TensorProto()
                restored.CopyFrom(fp32_weights[original])
                restored.name = original + ".fp32"
                graph.initializer.append(restored)
                present.add(restored.name)
            node.input[index] = original + ".fp32"
        # ONNX Runtime also quantizes a convolution's output; left out, the layer writes float to readers that are
        # not quantized layers themselves (an activation), while a quantized reader (a residual Add, a Conv) keeps
        # its Q/DQ on that input, as the quantizer leaves it.
        for value in node.output:
            for quantize in [n for n in graph.node if n.op_type == "QuantizeLinear" and value in n.input[:1]]:
                for dequantize in [n for n in graph.node if n.op_type == "DequantizeLinear"
                                   and quantize.output[0] in n.input[:1]]:
                    for reader in graph.node:
                        if reader.op_type in COMPUTE_OPS and reader.name not in names:
                            continue
                        reader.input[:] = [value if i == dequantize.output[0] else i for i in reader.input]
    _drop_unread(graph)
    return model


def _drop_unread(graph) -> None:
    outputs = {value.name for value in graph.output}
    while True:
        read = {name for node in graph.node for name in node.input} | outputs
        unread = [node for node in graph.node if not any(out in read for out in node.output)]
        if not unread:
            break
        for node in unread:
            graph.node.remove(node)
    read = {name for node in graph.node for name in node.input}
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)


def held_apart(fraction: float, total: int, fix: str) -> tuple[np.ndarray, np.ndarray]:
    """(held-out, rest) indices of ``total`` calibration images, the held-out ones spread evenly over them: a split
    whose order follows the source (an image folder sorted by class) is still covered by both.

    Raises:
        StageError: The fraction leaves no calibration image (``fix`` says what to raise).
    """
    count = max(1, int(round(fraction * total)))
    if count >= total:
        raise StageError(f"quantize.mixed_precision.held_out {fraction} leaves none of the {total} calibration "
                         "images to calibrate on", fix=f"lower quantize.mixed_precision.held_out or raise {fix}")
    held = np.unique(np.round(np.linspace(0, total - 1, count)).astype(int))
    return held, np.setdiff1d(np.arange(total), held)


def run_model(model, inputs: np.ndarray, input_name: str, batch: int = 64) -> list[np.ndarray]:
    """Every output of ``model`` (a ModelProto) on ``inputs``, by ONNX Runtime's CPU provider, in batches."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    chunks = [session.run(None, {input_name: inputs[i : i + batch]}) for i in range(0, len(inputs), batch)]
    return [np.concatenate([chunk[k] for chunk in chunks]) for k in range(len(chunks[0]))]


def normalised_error(reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
    """Σ over outputs of the mean over the last axis's channels of each channel's squared error over its variance
    (1/SNR per channel): a detector's raw head, whose class logits, box deltas and centerness differ in scale, weighs
    each kind alike."""
    total = 0.0
    for ref, out in zip(reference, outputs):
        ref64 = ref.astype(np.float64).reshape(-1, ref.shape[-1] if ref.ndim > 1 else 1)
        out64 = out.astype(np.float64).reshape(ref64.shape)
        variance = np.maximum(ref64.var(axis=0), 1e-12)
        total += float(np.mean(((out64 - ref64) ** 2).mean(axis=0) / variance))
    return total


def logit_kl(reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
    """Mean KL(FP32 ‖ candidate) of the class probabilities (the first output's logits): a classifier."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        shifted = x - x.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))

    p, q = log_softmax(reference[0]), log_softmax(outputs[0])
    return float(np.mean(np.sum(np.exp(p) * (p - q), axis=1)))


def sensitivity(candidate, fp32, inputs: np.ndarray, input_name: str,
                distortion: Callable[[list[np.ndarray], list[np.ndarray]], float],
                progress: Callable[[str], None] | None = None, reference: list[np.ndarray] | None = None,
                macs: dict[str, int] | None = None) -> tuple[float, list[LayerSensitivity]]:
    """Each quantized layer's leave-one-out sensitivity on ``inputs`` (held out from calibration).

    Args:
        candidate: The calibrated Q/DQ model (float islands in FP32, so that a layer can be returned to float32).
        fp32: The FP32 model it was quantized from.
        reference: The FP32 model's outputs on ``inputs`` when the caller has them (not run again).
        macs: :func:`layer_macs` of ``fp32`` when the caller has them.

    Returns:
        (the candidate's distortion, the layers ranked by what each buys back, most first; ties: fewer MACs first).
    """
    reference = run_model(fp32, inputs, input_name) if reference is None else reference
    base = distortion(reference, run_model(candidate, inputs, input_name))
    macs = layer_macs(fp32) if macs is None else macs
    ops = {node.name: node.op_type for node in candidate.graph.node}
    layers = quantized_layers(candidate)
    ranking = []
    for index, name in enumerate(layers):
        value = distortion(reference, run_model(dequantized(candidate, fp32, [name]), inputs, input_name))
        ranking.append(LayerSensitivity(name, ops[name], macs.get(name, 0), value, base - value))
        if progress and (index + 1) % 10 == 0:
            progress(f"{index + 1}/{len(layers)} layers")
    ranking.sort(key=lambda layer: (-layer.bought_back, layer.macs, layer.layer))
    return base, ranking


def fewest(passes: Callable[[int], bool], most: int) -> int | None:
    """The smallest k in 0..most for which ``passes(k)`` holds, by bisection (``passes`` assumed monotone: keeping
    more of the most sensitive layers in float does not lose accuracy). k = 0 is tried too: everything-INT8 missed
    on the test split, calibrated on every image, which says nothing of the held-out slice. Calls ``passes`` at
    most ⌈log2(most + 1)⌉ + 1 times. None when even ``most`` fails."""
    if most < 0 or not passes(most):
        return None
    failing, passing = -1, most
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if passes(middle):
            passing = middle
        else:
            failing = middle
    return passing
