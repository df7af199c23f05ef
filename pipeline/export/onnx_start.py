"""An ONNX file as the ladder's starting point (recipe ``start: {onnx: path, layout}``, or ``MODEL=model.onnx``).

The user's graph is the FP32 ``student`` rung: the export stage checks it, writes it in the ladder's form (one NCHW
float32 input named ``input`` with a dynamic batch, one output ``logits``) and scores it; the FP16 and INT8 rungs are
written from it as from any exported student. Everything that would fail later is refused before any stage runs, by
:func:`inspect_start`: a file that is no ONNX model, a second input, a layout that does not fit the declared
preprocessing, an opset or an operator TensorRT 10's ONNX parser does not import, an output that is not one score per
class of the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from device.errors import ConfigError
from device.files import sha256_file
from pipeline.export.onnx import INPUT_NAME, OUTPUT_NAME

# TensorRT 10's ONNX parser imports opsets 9 to 20 (onnx-tensorrt 10.x docs/operators.md); 11.x up to 25.
PARSED_OPSETS = (9, 20)
# ONNX Runtime writes per-channel Q/DQ (the quantize ladder's) from opset 13: older graphs are converted to it.
LADDER_OPSET = 13
# The operators of the default domain that onnx-tensorrt 10.x (docs/operators.md) marks unsupported.
UNPARSED_OPS = frozenset("""AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BlackmanWindow
    Col2Im CenterCropPad Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear HammingWindow HannWindow
    ImageDecoder MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional
    OptionalGetElement OptionalHasElement QLinearConv QLinearMatMul RegexFullMatch STFT SequenceAt SequenceConstruct
    SequenceEmpty SequenceErase SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence
    StringConcat StringNormalizer StringSplit TfIdfVectorizer Unique""".split())
MAX_BYTES = 2**31 - 1  # protobuf's limit on one serialized message: the rewritten graph is one
REEXPORT = ("re-export it from your training code: torch.onnx.export(model, torch.zeros(1, C, H, W), 'model.onnx', "
            "opset_version=17, input_names=['input'], dynamic_axes={'input': {0: 'batch'}})")


@dataclass(frozen=True)
class StartFacts:
    """What the checks found in the user's graph (recorded in the export stage's metrics)."""

    path: str
    sha256: str
    opset: int
    layout: str
    input_name: str
    input_shape: list[Any]
    output_name: str
    classes: int
    nodes: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def refuse_start(path: Path, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"start.onnx {path}: {problem}", fix=fix)


def start_files(path: Path) -> list[Path]:
    """The ``.onnx`` file and the external-data files its tensors name (weights saved beside a large model)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    files = [path]
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model: _load says so
        return files
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            location = next((entry.value for entry in tensor.external_data if entry.key == "location"), None)
            if location and path.parent / location not in files:
                files.append(path.parent / location)
    return files


def start_sha256(path: Path) -> str:
    """The sha256 of the model's bytes: the ``.onnx`` file's, or, with external data, of every file's sha256 in
    order (retrained weights saved beside an unchanged graph change it)."""
    files = start_files(path)
    if len(files) == 1:
        return sha256_file(path)
    import hashlib

    return hashlib.sha256("".join(sha256_file(f) if f.is_file() else "missing" for f in files).encode()).hexdigest()


def load_graph(path: Path):
    """The parsed model, or a refusal naming the file's sha256 (a text file named ``.onnx``, a truncated copy)."""
    import onnx

    if not path.is_file():
        raise refuse_start(path, "no such file", "check the path (relative paths are from where you run make)")
    size = sum(f.stat().st_size for f in start_files(path) if f.is_file())
    if size > MAX_BYTES:
        raise refuse_start(path, f"holds {size / 2**30:.1f} GiB; an ONNX start takes models under 2 GiB (protobuf's limit "
                            "on the graph it rewrites)", "start from a smaller classifier")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:  # protobuf's DecodeError, onnx's ValidationError, a missing external-data file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise refuse_start(path, f"is not a valid ONNX model (sha256 {sha256_file(path)[:16]}…): {first}",
                      "pass the .onnx file your exporter wrote; " + REEXPORT) from None
    if not model.graph.node:
        raise refuse_start(path, f"holds no graph (sha256 {sha256_file(path)[:16]}…)", REEXPORT)
    return model


def _subgraphs(graph):
    """``graph`` and every graph nested in its nodes' attributes (If branches, Loop and Scan bodies)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for nested in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _subgraphs(nested)


def graph_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def tensor_dims(value_info) -> list[Any]:
    """A tensor's dimensions: ints where static, the symbol (or None) where not."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


def check_ops(path: Path, model) -> None:
    nodes = [node for graph in _subgraphs(model.graph) for node in graph.node]
    foreign = sorted({f"{n.domain}::{n.op_type}" for n in nodes if n.domain not in ("", "ai.onnx")})
    if foreign:
        raise refuse_start(path, f"uses operators outside the ONNX standard: {', '.join(foreign)}",
                      "TensorRT imports them only through a plugin of your own; export without them (e.g. without "
                      "ONNX Runtime's graph optimisations, which write com.microsoft fused ops)")
    unparsed = sorted({n.op_type for n in nodes} & UNPARSED_OPS)
    if unparsed:
        raise refuse_start(path, f"uses {', '.join(unparsed)}, which TensorRT 10's ONNX parser does not import "
                            "(onnx-tensorrt docs/operators.md)", "export the model without them")


def check_image_input(path: Path, model, layout: str, channels: int, size: int) -> tuple[Any, list[Any]]:
    initialisers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initialisers]
    if len(inputs) != 1:
        raise refuse_start(path, f"has {len(inputs)} inputs ({', '.join(i.name for i in inputs) or 'none'}); EdgeFold "
                            "feeds one image tensor", "export a graph with one image input (fold the others in "
                                                      "as constants)")
    (image,) = inputs
    if image.type.tensor_type.elem_type != 1:  # TensorProto.FLOAT
        import onnx

        kind = onnx.TensorProto.DataType.Name(image.type.tensor_type.elem_type)
        raise refuse_start(path, f"input {image.name!r} is {kind}; the ladder feeds float32 images (its FP16 and INT8 "
                            "rungs keep float32 I/O)", "export the FP32 model: " + REEXPORT)
    dims = tensor_dims(image)
    if len(dims) != 4:
        raise refuse_start(path, f"input {image.name!r} has shape {dims}, not an image batch", REEXPORT)
    c, h, w = (dims[1], dims[2], dims[3]) if layout == "nchw" else (dims[3], dims[1], dims[2])
    if isinstance(c, int) and c != channels:
        other = dims[3] if layout == "nchw" else dims[1]
        other_layout = "nhwc" if layout == "nchw" else "nchw"
        hint = f"set start.layout: {other_layout} (the graph looks {other_layout.upper()}); " if other == channels else ""
        raise refuse_start(path, f"input {image.name!r} {dims} read as {layout.upper()} has {c} channels; preprocess.channels "
                            f"is {channels}", hint + "set preprocess.channels to the model's, or start.layout")
    if isinstance(h, int) and isinstance(w, int) and h != w:
        raise refuse_start(path, f"input {image.name!r} {dims} ({layout.upper()}) is {h}×{w}; EdgeFold's preprocessing "
                            "(device/preprocess.py) makes square inputs", "export the model at a square input size")
    for name, value in (("height", h), ("width", w)):
        if isinstance(value, int) and value != size:
            raise refuse_start(path, f"input {image.name!r} {dims} ({layout.upper()}) has {name} {value}; "
                                f"preprocess.input_size is {size}",
                          f"set preprocess.input_size: {value} (SET='preprocess.input_size={value}'), the size the "
                          "model was trained at")
    if isinstance(dims[0], int) and dims[0] != 1:
        raise refuse_start(path, f"input {image.name!r} fixes the batch at {dims[0]}", "export with batch 1 or a dynamic "
                      "batch: " + REEXPORT)
    return image, dims


def inspect_start(path: str | Path, layout: str, channels: int, size: int, classes: int) -> StartFacts:
    """Every check of a starting graph that needs no earlier stage, before any work: the rewrite into the ladder's
    form included.

    Raises:
        ConfigError: What is wrong with the file, and how to fix it.
    """
    return _checked(Path(path), layout, channels, size, classes)[0]


def _checked(path: Path, layout: str, channels: int, size: int,
             classes: int) -> tuple[StartFacts, bytes, list[str]]:
    """:func:`inspect_start`'s checks, with the rewrite they tried (:func:`_ladder_form`): its bytes and changes."""
    model = load_graph(path)
    opset = graph_opset(model)
    if not PARSED_OPSETS[0] <= opset <= PARSED_OPSETS[1]:
        raise refuse_start(path, f"is opset {opset}; TensorRT 10's ONNX parser imports opsets "
                            f"{PARSED_OPSETS[0]}–{PARSED_OPSETS[1]}", REEXPORT)
    check_ops(path, model)
    image, dims = check_image_input(path, model, layout, channels, size)
    if len(model.graph.output) != 1:
        raise refuse_start(path, f"has {len(model.graph.output)} outputs "
                            f"({', '.join(o.name for o in model.graph.output)}); a classifier's ladder reads one: "
                            "the class scores", "export only the logits (N × classes)")
    out = model.graph.output[0]
    got = run_graph(path, _example(layout, channels, size, 2 if dims[0] != 1 else 1))
    if got.ndim != 2 or got.shape[1] != classes:
        raise refuse_start(path, f"output {out.name!r} is {list(got.shape)} for a batch of {got.shape[0] if got.ndim else 1}; "
                            f"the data has {classes} classes", f"export the logits for the {classes} classes of "
                            "DATA=, in the data's class order (an ImageFolder's folders sorted by name)")
    facts = StartFacts(str(path), start_sha256(path), opset, layout, image.name, dims, out.name, classes,
                       len(model.graph.node))
    return (facts, *_ladder_form(facts, channels, size))  # the rewrite, and its batch of 3, tried now


def _example(layout: str, channels: int, size: int, batch: int) -> np.ndarray:
    shape = (batch, channels, size, size) if layout == "nchw" else (batch, size, size, channels)
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _session(model: Path | bytes):
    """An ONNX Runtime CPU session of a file or serialized graph; its failures are reported once, by the caller's
    refusal, not also on stderr."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                providers=["CPUExecutionProvider"])


def run_graph(path: Path | bytes, images: np.ndarray) -> np.ndarray:
    """The graph's one output under ONNX Runtime (CPU)."""
    try:
        session = _session(path)
        return session.run(None, {session.get_inputs()[0].name: images})[0]
    except Exception as err:  # onnxruntime's Fail / InvalidGraph / RuntimeException
        where = "the graph" if isinstance(path, bytes) else str(path)
        raise ConfigError(f"start.onnx: ONNX Runtime cannot run {where}: {str(err).strip().splitlines()[0]}",
                          fix=REEXPORT) from None


def run_graph_outputs(model: bytes, images: np.ndarray, names: Sequence[str]) -> list[np.ndarray]:
    """The graph's tensors ``names`` (graph outputs) under ONNX Runtime (CPU) on ``images``."""
    try:
        session = _session(model)
        return session.run(list(names), {session.get_inputs()[0].name: images})
    except Exception as err:  # onnxruntime's Fail / InvalidGraph / RuntimeException
        raise ConfigError(f"start.onnx: ONNX Runtime cannot run the graph: {str(err).strip().splitlines()[0]}",
                          fix=REEXPORT) from None


def renamed(model, old: str, new: str) -> None:
    """Renames the tensor ``old`` to ``new`` wherever the graph, or a graph nested in it, names it."""
    for graph in _subgraphs(model.graph):
        for node in graph.node:
            node.input[:] = [new if name == old else name for name in node.input]
            node.output[:] = [new if name == old else name for name in node.output]
        for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
            if value.name == old:
                value.name = new


def tensor_names(model) -> set[str]:
    names = set()
    for graph in _subgraphs(model.graph):
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
        names.update(value.name for value in (*graph.input, *graph.output, *graph.initializer))
    return names


def renamed_to_ladder(model, input_name: str, output_name: str, nhwc: bool, output_as: str = OUTPUT_NAME) -> None:
    """The image input named ``input`` (an NHWC graph's behind a Transpose from it) and the one output ``output_as``
    (a classifier's ``logits``), whatever tensors those names held before (a user's graph may call a hidden tensor
    ``logits``)."""
    from onnx import helper

    taken = tensor_names(model)
    staged = {input_name: "edgefold_staged_input", output_name: "edgefold_staged_logits"}
    for old, temporary in staged.items():
        renamed(model, old, temporary)
    for reserved in (INPUT_NAME, output_as, "input_nhwc"):
        if reserved in taken and reserved not in staged:
            renamed(model, reserved, f"edgefold_was_{reserved}")
    renamed(model, staged[output_name], output_as)
    if nhwc:
        renamed(model, staged[input_name], "input_nhwc")
        model.graph.node.insert(0, helper.make_node("Transpose", [INPUT_NAME], ["input_nhwc"], perm=[0, 2, 3, 1],
                                                    name="edgefold_nchw_to_nhwc"))
        next(value for value in model.graph.input if value.name == "input_nhwc").name = INPUT_NAME
    else:
        renamed(model, staged[input_name], INPUT_NAME)


def set_shape(value_info, dims: Sequence[int | str]) -> None:
    """Replaces a graph input's or output's shape: ints static, strings symbolic (a dimension holds one or the other:
    setting both keeps the last)."""
    tensor = value_info.type.tensor_type
    tensor.ClearField("shape")
    for value in dims:
        dim = tensor.shape.dim.add()
        if isinstance(value, str):
            dim.dim_param = value
        else:
            dim.dim_value = value


def _ladder_form(facts: StartFacts, channels: int, size: int) -> tuple[bytes, list[str]]:
    """The user's graph in the ladder's form, serialized, and what was changed in words: opset ≥ 13, one float32 NCHW
    input ``input`` of a dynamic batch (a Transpose in front for an NHWC graph), one output ``logits``, intermediate
    shapes inferred again; run at a batch of 3 to prove the batch is free.

    Raises:
        ConfigError: When the graph cannot be converted, or fixes its batch inside (a Reshape to [1, …]).
    """
    path = Path(facts.path)
    model, changes = opened_for_ladder(path, facts.opset, REEXPORT)
    graph = model.graph
    renamed_to_ladder(model, facts.input_name, facts.output_name, facts.layout == "nhwc")
    if facts.layout == "nhwc":
        changes.append("NHWC input behind a Transpose from NCHW")
    set_shape(graph.input[0], ("batch", channels, size, size))
    set_shape(graph.output[0], ("batch", facts.classes))
    if facts.input_shape[0] == 1:
        changes.append("batch made dynamic (it was 1)")
    example = _example("nchw", channels, size, 3)
    data = with_free_batch(model, path, example, (facts.classes,), facts.input_shape[0] == 1, REEXPORT, changes,
                           given=example.transpose(0, 2, 3, 1).copy() if facts.layout == "nhwc" else example)
    return data, changes


def opened_for_ladder(path: Path, opset: int, fix: str):
    """A start's graph loaded, at the ladder's opset at least, with no initialiser listed as a graph input; and what
    was changed, in words. Every task's start takes this first step (its names and shapes are the task's).

    Raises:
        ConfigError: The opset cannot be converted (``fix``: how to export it again).
    """
    import onnx
    from onnx import version_converter

    model, changes = onnx.load(str(path)), []
    if opset < LADDER_OPSET:
        try:
            model = version_converter.convert_version(model, LADDER_OPSET)
        except Exception as err:  # the converter raises RuntimeError / ConvertError by adapter
            raise refuse_start(path, f"opset {opset} cannot be converted to {LADDER_OPSET} (which the INT8 ladder "
                                     f"writes per-channel Q/DQ in): {err}", fix) from None
        changes.append(f"opset {opset} → {LADDER_OPSET}")
    # Initialisers listed as graph inputs too (older exporters) would be inputs a runner could be asked to feed;
    # from IR 4 on an initialiser need not be one.
    model.ir_version = max(model.ir_version, 7)
    initialisers = {t.name for t in model.graph.initializer}
    kept = [value for value in model.graph.input if value.name not in initialisers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model, changes


def probed_shapes(model, names: Sequence[str], example: np.ndarray) -> dict[str, list[int]]:
    """The shapes of the tensors ``names`` as ONNX Runtime computes them on ``example`` (ONNX's shape inference loses
    them behind a Resize, a GatherElements or a Reshape of a computed shape: a YOLO head's), with the initialisers'
    own."""
    import onnx

    try:
        types = {v.name: v.type.tensor_type.elem_type
                 for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    except Exception:  # noqa: BLE001 (inference is a nicety: ONNX Runtime fills an unset type itself)
        types = {}
    initialisers = {t.name: list(t.dims) for t in model.graph.initializer}
    probed = sorted(set(names) - set(initialisers))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {output.name for output in copy.graph.output}
    copy.graph.output.extend(onnx.helper.make_tensor_value_info(name, types.get(name) or onnx.TensorProto.FLOAT, None)
                             for name in probed if name not in present)
    values = run_graph_outputs(copy.SerializeToString(), example, probed) if probed else []
    shapes = {name: list(value.shape) for name, value in zip(probed, values)}
    shapes.update({name: dims for name, dims in initialisers.items() if name in names})
    return shapes


def widened_batch(model, example: np.ndarray) -> int:
    """Makes each operator that fixes the batch at 1 with a constant shape follow the batch instead, in place;
    returns how many were changed.

    A static export (Ultralytics' ``dynamic=False``, torch.onnx without ``dynamic_axes``) traces ``view(1, …)`` and
    ``interpolate(size=…)`` into constant shapes. Where such an operator's data is computed from the image and is 1
    deep at batch 1 (``example``, one image), its constant target starting with 1 is rewritten: a ``Reshape``'s to
    0 there (ONNX's "copy this dimension from the input"); a ``Resize``'s ``sizes`` to the ``scales`` they make
    (1 for the batch and the channels). Whether that was all the graph fixed is proved by the caller's answers at
    batch 1 and batch N, not assumed."""
    from onnx import numpy_helper

    graph = model.graph
    initialisers = {t.name: t for t in graph.initializer}
    from_image, frontier = {graph.input[0].name}, True
    while frontier:  # the tensors computed from the image, not from constants alone
        frontier = False
        for node in graph.node:
            if any(name in from_image for name in node.input) and not set(node.output) <= from_image:
                from_image.update(node.output)
                frontier = True

    def fixed_at_one(node, position: int) -> bool:
        target = node.input[position] if len(node.input) > position else ""
        return (node.input[0] in from_image and target in initialisers
                and numpy_helper.to_array(initialisers[target])[:1].tolist() == [1])

    found = [(node, 1) for node in graph.node if node.op_type == "Reshape" and fixed_at_one(node, 1)]
    found += [(node, 3) for node in graph.node if node.op_type == "Resize" and fixed_at_one(node, 3)]
    if not found:
        return 0
    shapes = probed_shapes(model, [node.input[0] for node, _ in found], example)
    copied: dict[str, str] = {}
    changed = 0
    for node, position in found:
        data = shapes.get(node.input[0], [None])
        if data[:1] != [1]:
            continue
        target = numpy_helper.to_array(initialisers[node.input[position]])
        if node.op_type == "Reshape":
            if node.input[1] not in copied:
                values = target.copy()
                values[0] = 0
                copied[node.input[1]] = f"{node.input[1]}_batch_copied"
                graph.initializer.append(numpy_helper.from_array(values, copied[node.input[1]]))
            node.input[1] = copied[node.input[1]]
            for attribute in node.attribute:  # allowzero=1 would make the 0 a literal zero
                if attribute.name == "allowzero":
                    attribute.i = 0
        else:
            if len(target) != len(data) or any(d <= 0 for d in data):
                continue
            scales = numpy_helper.from_array(np.asarray([1.0, 1.0, *(t / d for t, d in zip(target[2:], data[2:]))],
                                                        np.float32), f"{node.name}_scales_for_batch")
            graph.initializer.append(scales)
            inputs = list(node.input)
            node.input[:] = [inputs[0], inputs[1] if len(inputs) > 1 else "", scales.name]
        changed += 1
    return changed


def one_at_a_time(model: Path | bytes, images: np.ndarray) -> np.ndarray:
    """The graph's one output for each image fed alone (batch 1), concatenated: what its answers are, whatever it
    does with a batch."""
    try:
        session = _session(model)
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, {name: images[i:i + 1]})[0] for i in range(len(images))])
    except Exception as err:  # onnxruntime's Fail / InvalidGraph / RuntimeException
        where = "the graph" if isinstance(model, bytes) else str(model)
        raise ConfigError(f"start.onnx: ONNX Runtime cannot run {where}: {str(err).strip().splitlines()[0]}",
                          fix=REEXPORT) from None


def batch_disagreement(batched: np.ndarray, alone: np.ndarray) -> list[int]:
    """The images (0-based) whose answer in a batch differs from their answer fed alone, beyond float rounding
    (kernels chosen by batch size: 1e-3 of the output's scale)."""
    scale = max(1.0, float(np.abs(alone).max()) if alone.size else 1.0)
    if batched.shape != alone.shape:
        return list(range(len(alone)))
    return [i for i in range(len(alone)) if not np.allclose(batched[i], alone[i], rtol=1e-3, atol=1e-3 * scale)]


def with_free_batch(model, path: Path, example: np.ndarray, per_image: Sequence[int], was_one: bool, fix: str,
                    changes: list[str] | None = None, given: np.ndarray | None = None,
                    explain: Callable[[np.ndarray, np.ndarray], ConfigError | None] | None = None) -> bytes:
    """The rewritten graph's shapes inferred again and checked, serialized, and proved free in its batch by its
    answers: run at the batch of ``example`` (3), each image's answer must equal the given graph's for that image
    fed alone (``given``: the same images as the given graph takes them, an NHWC graph's; default ``example``). A
    graph traced at batch 1 (``was_one``) first has the Reshapes that fix it widened (:func:`widened_batch`), said
    in ``changes``. ``explain(batched, alone)`` words a task's own refusal of answers that differ.

    Raises:
        ConfigError: The graph cannot be rewritten, or answers a batch otherwise than one image at a time (``fix``:
            how to export it again).
    """
    import onnx

    del model.graph.value_info[:]  # shapes recorded for the old batch and size: inferred again
    widened = widened_batch(model, example[:1]) if was_one else 0  # before inference: ONNX Runtime plans by it
    try:
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
    except Exception as err:  # onnx's InferenceError / ValidationError
        raise refuse_start(path, f"cannot be rewritten with a free batch and the ladder's names: "
                                 f"{str(err).strip().splitlines()[0]}",
                           "report this model to EdgeFold; " + fix) from None
    if widened and changes is not None:
        changes.append(f"batch widened: {widened} Reshape/Resize node(s) that fixed it at 1 now follow it (answers "
                       f"at batch {len(example)} checked against batch 1)")
    data = model.SerializeToString()
    batch = len(example)
    alone = one_at_a_time(path, example if given is None else given)
    try:
        got = run_graph(data, example)
    except ConfigError as err:
        if not was_one:
            raise
        said = err.message.split("cannot run the graph: ")[-1]
        raise refuse_start(path, f"fixes its batch at 1 inside the graph beyond its Reshapes (widened {widened}); "
                                 f"ONNX Runtime at a batch of {batch}: {said}", "export with a dynamic batch: " + fix) \
            from None
    if tuple(got.shape) != (batch, *per_image) or batch_disagreement(got, alone):
        refusal = explain(got, alone) if explain and tuple(got.shape) == tuple(alone.shape) else None
        if refusal is not None:
            raise refusal
        raise refuse_start(path, f"answers a batch of {batch} otherwise than one image at a time (output "
                                 f"{list(got.shape)}; images {', '.join(str(i + 1) for i in batch_disagreement(got, alone))} "
                                 "differ)", "export with a dynamic batch: " + fix)
    return data


def write_start_graph(path: str | Path, layout: str, channels: int, size: int, classes: int,
                      out: Path) -> tuple[StartFacts, dict[str, Any]]:
    """Checks the file again (it may have changed since the preflight) and writes the rewrite those checks made
    (:func:`_ladder_form`) to ``out``.

    Returns:
        The file's facts, and what was changed (in words), the opset, the node count and the written file's size,
        for the log and the manifest.
    """
    import onnx

    facts, data, changes = _checked(Path(path), layout, channels, size, classes)
    out.write_bytes(data)
    return facts, {"changes": changes, "opset": max(facts.opset, LADDER_OPSET),
                   "nodes": len(onnx.load_from_string(data).graph.node), "size_mb": len(data) / 1e6}


def start_parity(facts: StartFacts, written: Path, images: np.ndarray) -> dict[str, Any]:
    """The written graph against the user's own on the same preprocessed images (NCHW; transposed for an NHWC
    graph, fed one at a time to a graph of batch 1): the rewrite must change nothing."""
    given = images if facts.layout == "nchw" else images.transpose(0, 2, 3, 1).copy()
    step = 1 if facts.input_shape[0] == 1 else 64
    reference = np.concatenate([run_graph(Path(facts.path), given[i : i + step]) for i in range(0, len(given), step)])
    got = np.concatenate([run_graph(written, images[i : i + 64]) for i in range(0, len(images), 64)])
    diff = np.abs(got - reference)
    return {"images": int(len(images)), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "top1_agreement": float((got.argmax(1) == reference.argmax(1)).mean())}


def graph_compute(path: Path, sample: Sequence[int]) -> dict[str, float]:
    """Parameters (float initialisers) and multiply-accumulates (Conv, ConvTranspose, Gemm, MatMul and their bias
    adds) of an ONNX classifier at one input of ``sample`` (C, H, W): Torch-Pruning's per-layer count
    (:func:`pipeline.models.layer_macs`); its total, which the other rungs show, also counts BatchNorm (folded into
    the convolutions of an exported graph), activations and pooling, a few percent more. The
    shapes are those ONNX Runtime computes on a zero image (ONNX's shape inference loses them behind a Reshape of a
    computed shape, a channel shuffle's)."""
    import onnx
    from onnx import numpy_helper

    from device.jobs.marked import with_outputs

    model = onnx.load(str(path))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    counted = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul")]
    # Outputs, activations in, and kernels computed in the graph (a weight-normalised convolution's).
    probed = sorted({n.output[0] for n in counted} | {name for n in counted for name in n.input[:2]
                                                       if name and name not in weights}
                    - {model.graph.input[0].name})
    session = _session(with_outputs(path, probed))
    image = np.zeros((1, *sample), np.float32)
    got = session.run(probed, {session.get_inputs()[0].name: image})
    shapes = {name: list(value.shape) for name, value in zip(probed, got)}
    shapes[model.graph.input[0].name] = list(image.shape)
    params = sum(w.size for w in weights.values() if w.dtype.kind == "f")
    macs = 0
    for node in counted:
        out = shapes[node.output[0]]
        if node.op_type in ("Conv", "ConvTranspose"):
            kernel = weights[node.input[1]].shape if node.input[1] in weights else shapes[node.input[1]]
            if node.op_type == "Conv":  # out × in/groups × k…: each output element sums in/groups × k… products
                macs += int(np.prod(out)) * int(np.prod(kernel[1:]))
            else:  # in × out/groups × k…: each input element feeds out/groups × k… outputs
                macs += int(np.prod(shapes[node.input[0]])) * int(np.prod(kernel[1:]))
        else:
            a = shapes.get(node.input[0]) or list(weights[node.input[0]].shape)
            transposed = any(attr.name == "transA" and attr.i for attr in node.attribute)
            macs += int(np.prod(out)) * (a[-2] if transposed else a[-1])
        macs += int(np.prod(out)) if len(node.input) > 2 and node.input[2] else 0  # a bias add, as Torch-Pruning counts
    return {"params_m": params / 1e6, "macs_g": macs / 1e9}
