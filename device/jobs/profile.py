"""Per-layer profile: where one inference's time goes, layer by layer, in the engine that ran.

One typed table for every runtime, so the report reads TensorRT on a Jetson and ONNX Runtime on the
loopback agent the same way:

* **TensorRT**: ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` on an engine
  built with ``ProfilingVerbosity.DETAILED`` gives each engine layer's I/O formats (its precision), its
  tactic and, for DLA builds, whether it ran on the DLA; an ``IProfiler`` attached during a separate
  profiling pass (never the timed window: it makes every enqueue synchronous) gives each layer's time.
* **ONNX Runtime**: ``SessionOptions.enable_profiling`` on a second session, run for a few iterations,
  ``end_profiling()`` → a Chrome-trace JSON whose ``Node`` events carry each kernel's duration, op and
  input/output element types.

From these :func:`batch_profile` derives the share of time per precision (INT8 against the layers left in
float), the layers that fell back from the DLA to the GPU, and the float layers that cost the most.
Q/DQ, reformat and cast layers are *overhead*, a category of their own: they touch INT8 tensors but
compute nothing, so counting them as INT8 would credit quantization with the time it costs.
:func:`int8_payoff_reasons` turns a table into the reasons INT8 may not pay off.
No torch, no TensorRT: the builders take the runtimes' outputs as plain data.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any, Collection, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROFILE_FORMAT = "edgefold.profile/1"
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")
# Layers of an INT8 model that stay in float and cost the most: how many the table names.
FLOAT_LEFT_BEHIND = 5
# The profiling pass: enough iterations for a stable mean, few enough to stay short on a Jetson.
PROFILE_ITERATIONS = 20
PROFILE_WARMUP = 3
PROFILE_MIN_ITERATIONS = 3
PROFILE_BUDGET_S = 3.0  # per batch size: a ResNet-50 at batch 32 on a CPU loopback agent gets ~3 iterations
# int8_payoff_reasons: above these shares the profile names the overhead and the float islands as reasons.
# 15% overhead is about what INT8 saves over FP16 on a small CNN's compute, so more eats the gain; a quarter
# of an INT8 model's time in float means the quantized part cannot make the whole much faster.
OVERHEAD_REASON_SHARE = 0.15
FLOAT_ISLAND_SHARE = 0.25
OverheadKind = Literal["qdq", "reformat", "cast"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LayerTiming(_Model):
    """One layer (TensorRT engine layer, or ONNX Runtime kernel) and its time per inference."""

    name: str = Field(description="the engine layer's name (fused layers joined by ' + ') or the ONNX node's")
    kind: str = Field(description="TensorRT LayerType (CaskConvolution, Reformat, …) or the ONNX op type")
    precision: str = Field(description="int8, fp16, bf16, fp32, fp8 or other (integer/shape work)")
    device: Literal["gpu", "dla", "cpu"]
    tactic: str | None = Field(None, description="TensorRT's tactic name; null on ONNX Runtime")
    time_ms: float = Field(ge=0, description="median time per inference over the profiling pass, ms (the mean "
                                             "when the runtime reports only totals)")
    share: float = Field(ge=0, le=1, description="fraction of the profiled time of one inference")
    fell_back: bool = Field(False, description="DLA was asked for and this layer ran on the GPU")
    overhead: OverheadKind | None = Field(None, description="qdq, reformat or cast: a layer that converts "
                                                            "precision or layout and computes nothing; null for "
                                                            "compute layers (and DLA transfers, which are DLA I/O)")

    @model_validator(mode="before")
    @classmethod
    def _classify_older(cls, data: Any) -> Any:
        # Profiles stored before the overhead field existed: classify them on load, as batch_profile would.
        if isinstance(data, dict) and "overhead" not in data:
            data = {**data, "overhead": overhead_kind(data.get("kind", ""), data.get("name", ""))}
        return data


class BatchProfile(_Model):
    """The per-layer table at one batch size, with what the report prints from it."""

    batch_size: int = Field(ge=1)
    iterations: int = Field(ge=1, description="profiled inferences averaged")
    total_ms: float = Field(ge=0, description="sum of the layers' times (the profiler's view of one inference)")
    layers: list[LayerTiming] = Field(description="slowest first")
    share_by_precision: dict[str, float] = Field(description="fraction of time per precision")
    int8_share: float = Field(ge=0, le=1, description="fraction of time in INT8 compute layers (overhead excluded)")
    overhead_share: float = Field(0.0, ge=0, le=1, description="fraction of time in Q/DQ, reformat and cast layers")
    dla_share: float | None = Field(None, description="fraction of time on the DLA; null when none was asked for")
    fallback_layers: list[str] = Field(default_factory=list,
                                       description="layers that could not run on the DLA and ran on the GPU")
    float_left_behind: list[str] = Field(default_factory=list,
                                         description="in a model with INT8 layers, the float layers costing most")

    @model_validator(mode="before")
    @classmethod
    def _split_older(cls, data: Any) -> Any:
        # Stored before overhead_share existed, int8_share counted the Q/DQ and reformat layers as INT8 and
        # float_left_behind could name a Cast: both are recomputed from the stored layers, so an old profile
        # reads the same as a new one.
        if not isinstance(data, dict) or "overhead_share" in data or "layers" not in data:
            return data
        layers = [LayerTiming.model_validate(layer) if isinstance(layer, dict) else layer for layer in data["layers"]]
        overhead = {layer.name for layer in layers if layer.overhead}
        return {**data, "layers": layers,
                "overhead_share": min(1.0, sum(layer.share for layer in layers if layer.overhead)),
                "int8_share": min(1.0, sum(layer.share for layer in layers
                                            if layer.precision == "int8" and not layer.overhead)),
                "float_left_behind": [name for name in data.get("float_left_behind", []) if name not in overhead]}


class Profile(_Model):
    """A job's per-layer profile: one table per measured batch size, from the engine that ran."""

    format: Literal["edgefold.profile/1"] = PROFILE_FORMAT
    runtime: str
    source: str = Field(description="what the numbers come from (runtime API names)")
    requested_device: Literal["gpu", "dla", "cpu"]
    batches: list[BatchProfile]
    notes: list[str] = Field(default_factory=list)

    def batch(self, batch_size: int) -> BatchProfile | None:
        return next((b for b in self.batches if b.batch_size == batch_size), None)


# ----------------------------------------------------------------- precision from element types
_TYPE_PRECISION = (  # substring (lower case) → precision; the order matters ("int8" before "int")
    ("fp8", "fp8"), ("float8", "fp8"), ("int8", "int8"), ("uint8", "int8"), ("int4", "int8"),
    ("bfloat16", "bf16"), ("bf16", "bf16"), ("float16", "fp16"), ("fp16", "fp16"), ("half", "fp16"),
    ("fp32", "fp32"), ("float", "fp32"),
)
_RANK = {"int8": 0, "fp8": 1, "fp16": 2, "bf16": 3, "fp32": 4, "other": 5}


def type_precision(name: str) -> str:
    """One element type as a precision: ``float`` / ``Row major linear FP32`` → fp32, ``Int8`` → int8.

    Accepts ONNX Runtime's type names (``float``, ``float16``, ``int8``, ``uint8``, ``int64``) and
    TensorRT's inspector ``Format/Datatype`` strings (``Channel major FP16 format where …``,
    ``Row major Int8 format``, ``Half``, ``Float``).
    """
    text = name.lower()
    for needle, precision in _TYPE_PRECISION:
        if needle in text:
            return precision
    return "other"


def layer_precision(types: Iterable[str]) -> str:
    """A layer's precision from its tensors' types: INT8 when any tensor is INT8 (the layer is on the
    quantized path: a Q/DQ or an INT8 kernel), else the narrowest float type, else ``other``."""
    found = [type_precision(t) for t in types]
    return min(found, key=_RANK.__getitem__) if found else "other"


# ----------------------------------------------------------------- overhead layers
# ONNX op types (ONNX Runtime's op_name) and TensorRT LayerTypes that only convert precision or layout.
# ReorderInput/ReorderOutput are ONNX Runtime's NCHWc layout conversions on CPU: its reformats.
_OVERHEAD_KINDS: dict[str, OverheadKind] = {
    "quantizelinear": "qdq", "dequantizelinear": "qdq", "dynamicquantizelinear": "qdq", "quantize": "qdq",
    "dequantize": "qdq", "reformat": "reformat", "reorderinput": "reformat", "reorderoutput": "reformat",
    "cast": "cast"}
# TensorRT names what it inserts, whatever LayerType it reports: "Reformatting CopyNode for Input Tensor 0 to
# conv1", "conv1 reformatted input 0"; an unfused Q/DQ keeps its ONNX node's name ("QuantizeLinear_7", with
# "_quantize_scale_node" appended in TensorRT 8.x build logs and layer names).
_OVERHEAD_NAMES: tuple[tuple[str, OverheadKind], ...] = (
    ("reformatting copynode", "reformat"), ("reformatted input", "reformat"), ("reformatted output", "reformat"),
    ("quantize_scale_node", "qdq"), ("quantizelinear", "qdq"))


def overhead_kind(kind: str, name: str) -> OverheadKind | None:
    """Whether a layer is overhead: ``qdq``, ``reformat``, ``cast``, or None for a compute layer.

    Args:
        kind: The ONNX op type (ONNX Runtime) or TensorRT LayerType.
        name: The layer's name. A reformat TensorRT inserted is named after the layer it feeds, fused or not
            (``Reformatting CopyNode for Input Tensor 0 to conv1 + relu1``); otherwise only an unfused name counts:
            TensorRT joins fused layers with ``' + '`` and names Myelin subgraphs
            ``{ForeignNode[QuantizeLinear_0...Gemm_9]}``, and those compute.
    """
    found = _OVERHEAD_KINDS.get(kind.lower())
    if found:
        return found
    text = name.lower()
    if not name.startswith("{") and any(needle in text for needle, category in _OVERHEAD_NAMES
                                        if category == "reformat"):
        return "reformat"
    if " + " in name or name.startswith("{"):
        return None
    return next((category for needle, category in _OVERHEAD_NAMES if needle in text), None)


# ----------------------------------------------------------------- the table
def batch_profile(batch_size: int, iterations: int, timings: Sequence[dict[str, Any]],
                  requested_device: str) -> BatchProfile:
    """Builds one batch size's table.

    Args:
        batch_size: The batch profiled.
        iterations: How many inferences ``timings`` sum over.
        timings: One dict per layer: ``name``, ``kind``, ``precision``, ``device``, ``tactic`` (optional)
            and either ``samples_ms`` (one time per iteration: the layer's time is their median, so one
            preempted iteration on a shared CPU does not make a layer look slow) or ``total_ms`` (summed
            over the iterations: the mean is taken); optionally ``overhead`` (else :func:`overhead_kind`
            decides from the kind and name). Layers named twice are added together.
        requested_device: ``dla`` when the engine was built for the DLA (every GPU layer then fell back).
    """
    import statistics

    merged: dict[str, dict[str, Any]] = {}
    for timing in timings:
        entry = merged.setdefault(timing["name"], {**timing, "time_ms": 0.0})
        samples = timing.get("samples_ms")
        entry["time_ms"] += (statistics.median(samples) if samples else float(timing.get("total_ms", 0.0)) / iterations)
    total = sum(entry["time_ms"] for entry in merged.values())
    layers = []
    for entry in sorted(merged.values(), key=lambda e: -e["time_ms"]):
        time_ms = entry["time_ms"]
        overhead = (None if entry["kind"] == "DLA transfer"
                    else entry.get("overhead") or overhead_kind(entry["kind"], entry["name"]))
        layers.append(LayerTiming(name=entry["name"], kind=entry["kind"], precision=entry["precision"],
                                  device=entry["device"], tactic=entry.get("tactic"), time_ms=time_ms,
                                  share=min(1.0, time_ms / total) if total > 0 else 0.0,
                                  fell_back=requested_device == "dla" and entry["device"] == "gpu",
                                  overhead=overhead))
    shares: dict[str, float] = defaultdict(float)
    for layer in layers:
        shares[layer.precision] += layer.share
    compute = [layer for layer in layers if not layer.overhead]
    # A model whose only INT8 layers are its Q/DQ (ONNX Runtime on CPU running the conv between them in
    # float) is still a quantized model: its float layers are what the quantization left behind.
    quantized = any(layer.precision == "int8" or layer.overhead == "qdq" for layer in layers)
    floats = [layer.name for layer in compute if layer.precision in FLOAT_PRECISIONS]
    return BatchProfile(
        batch_size=batch_size, iterations=iterations, total_ms=total, layers=layers,
        share_by_precision=dict(sorted(shares.items(), key=lambda kv: -kv[1])),
        int8_share=min(1.0, sum(layer.share for layer in compute if layer.precision == "int8")),
        overhead_share=min(1.0, sum(layer.share for layer in layers if layer.overhead)),
        dla_share=(min(1.0, sum(l.share for l in layers if l.device == "dla")) if requested_device == "dla" else None),
        fallback_layers=[layer.name for layer in layers if layer.fell_back],
        float_left_behind=floats[:FLOAT_LEFT_BEHIND] if quantized else [])


# ----------------------------------------------------------------- ONNX Runtime
def from_onnxruntime_trace(events: list[dict[str, Any]], batch_size: int, skip_runs: int = 0,
                           device: str = "cpu") -> BatchProfile:
    """The table from an ONNX Runtime profiler trace (``InferenceSession.end_profiling()``'s JSON).

    Args:
        events: The trace's events. ``Session`` events named ``model_run`` delimit the runs; ``Node``
            events named ``<node>_kernel_time`` carry ``dur`` (µs) and ``args`` (``op_name``,
            ``provider``, ``input_type_shape``, ``output_type_shape``).
        batch_size: The batch the session ran.
        skip_runs: Leading runs to leave out (the warm-up).
        device: ``cpu``, or ``gpu`` for the CUDA execution provider.
    """
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])[skip_runs:]
    if not runs:
        from device.errors import RunnerError

        raise RunnerError("ONNX Runtime's profile has no model_run events", fix="profile at least one run")
    windows = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    timings: dict[str, dict[str, Any]] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if not any(start <= event["ts"] <= end for start, end in windows):
            continue
        args = event.get("args", {})
        types = [t for entry in args.get("input_type_shape", []) + args.get("output_type_shape", [])
                 for t in entry]
        provider = args.get("provider", "")
        node = name[: -len("_kernel_time")]
        entry = timings.setdefault(node, {
            "name": node, "kind": args.get("op_name", "?"), "precision": layer_precision(types),
            "device": "gpu" if provider.startswith(("CUDA", "Tensorrt", "TensorRT")) else device, "samples_ms": []})
        entry["samples_ms"].append(event["dur"] / 1e3)
    return batch_profile(batch_size, len(runs), list(timings.values()), requested_device=device)


# ----------------------------------------------------------------- TensorRT
def inspector_layers(engine_information: str) -> list[dict[str, Any]]:
    """The engine layers of ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)``.

    With ``ProfilingVerbosity.DETAILED`` each layer is an object (``Name``, ``LayerType``, ``Inputs``
    and ``Outputs`` with ``Format/Datatype``, ``TacticName``); with less, only names (strings) — then
    precision and device are unknown (``other``/``gpu``), which the profile notes.
    """
    data = json.loads(engine_information)
    layers = data.get("Layers", []) if isinstance(data, dict) else []
    return [layer if isinstance(layer, dict) else {"Name": str(layer)} for layer in layers]


# What a DLA engine's IProfiler reports besides its {ForeignNode[…]} subgraphs: the copies into and out of
# the DLA's memory and their completion (NVIDIA/TensorRT#3143: "images to nvm", "head_3 from nvm",
# "images copy finish"). They are DLA time (its I/O), not layers that fell back to the GPU.
DLA_TRANSFER_SUFFIXES = (" to nvm", " from nvm", " copy finish")


def is_dla_transfer(name: str) -> bool:
    """Whether a profiler entry is a DLA engine's own memory transfer (:data:`DLA_TRANSFER_SUFFIXES`)."""
    return name.endswith(DLA_TRANSFER_SUFFIXES)


_FOREIGN = re.compile(r"^\{ForeignNode\[(?P<first>.*?)(?:\.\.\.(?P<last>.*))?\]\}$")


def _members(name: str) -> list[str]:
    """The network layers an engine layer's name covers: ``{ForeignNode[first...last]}`` (a DLA or Myelin
    subgraph: its ends), ``a + b`` (fused), else the name itself."""
    found = _FOREIGN.match(name)
    if found:
        return [found["first"], *([found["last"]] if found["last"] else [])]
    return name.split(" + ")


def _on_dla(layer: dict[str, Any], placement: tuple[Collection[str], Collection[str]] | None) -> bool:
    """Whether an engine layer ran on the DLA.

    With the build's record (``placement``: the network layers ``IBuilderConfig.can_run_on_DLA`` accepted, and those
    it refused), a DLA subgraph is an engine layer ``{ForeignNode[first...last]}`` that covers an accepted layer and
    no refused one; a layer named otherwise (``conv + relu``, a reformat) is a GPU kernel even in a DLA build, since
    TensorRT moves accepted layers to the GPU when a DLA subgraph limit is reached. The ends of a subgraph may be the
    parser's own Q/DQ layers, which the record leaves out. No source read documents what the inspector says of a DLA
    layer, so without the record (an engine built before it was kept) the only evidence left is a type, tactic or
    parameter type that names the DLA; a Myelin ``{ForeignNode[…]}`` on the GPU names none.
    """
    if placement is not None:
        accepted, refused = placement
        members = _members(str(layer.get("Name", ""))) if _FOREIGN.match(str(layer.get("Name", ""))) else []
        return any(m in accepted for m in members) and not any(m in refused for m in members)
    text = f"{layer.get('LayerType', '')} {layer.get('TacticName', '')} {layer.get('ParameterType', '')}".lower()
    return "dla" in text


def _inspector_overhead(layer: dict[str, Any]) -> OverheadKind | None:
    """Q/DQ as TensorRT's inspector marks it: by origin, not type.

    trex (tools/experimental/trt-engine-explorer at v10.16) keys an unfused Q/DQ on ``LayerType`` ``Reformat`` with
    ``Origin`` ``QDQ`` (graphing.py; its example engines carry ``"LayerType": "Reformat", "Origin": "QDQ"``), and its
    Q/DQ linter (lint.py) finds a dangling Q/DQ as a ``Scale`` layer with INT8 on one side only.
    """
    if str(layer.get("Origin", "")).upper() == "QDQ":
        return "qdq"
    if str(layer.get("LayerType", "")).lower() == "scale":
        sides = [[type_precision(t.get("Format/Datatype", "")) for t in layer.get(key, [])]
                 for key in ("Inputs", "Outputs")]
        if ("int8" in sides[0]) != ("int8" in sides[1]):
            return "qdq"
    return None


def from_tensorrt(engine_information: str, layer_times_ms: dict[str, Any], batch_size: int, iterations: int,
                  requested_device: str, dla_layers: Collection[str] | None = None,
                  dla_refused: Collection[str] = ()) -> BatchProfile:
    """The table from the inspector's JSON and the ``IProfiler``'s per-layer times.

    Args:
        engine_information: ``get_engine_information(LayerInformationFormat.JSON)``.
        layer_times_ms: ``report_layer_time(name, ms)`` per name: a list of one time per run (the median
            is taken), or their sum over ``iterations`` runs (the mean is taken).
        batch_size: The batch profiled.
        iterations: Profiled inferences.
        requested_device: ``dla`` for a DLA build, else ``gpu``.
        dla_layers: The network layers the DLA accepted (the build's ``build.json``); None when not recorded.
        dla_refused: Those it refused (``dla_unsupported_layers``).
    """
    return batch_profile(batch_size, iterations,
                         tensorrt_timings(engine_information, layer_times_ms, requested_device, dla_layers, dla_refused),
                         requested_device)


def tensorrt_timings(engine_information: str, layer_times_ms: dict[str, Any], requested_device: str,
                     dla_layers: Collection[str] | None = None, dla_refused: Collection[str] = ()) -> list[dict[str, Any]]:
    """One engine's layers as :func:`batch_profile` timings (see :func:`from_tensorrt` for the arguments);
    engines of one model (Torch-TensorRT compiles one per TensorRT-supported subgraph) are added together."""
    info = {layer["Name"]: layer for layer in inspector_layers(engine_information)}
    placement = None if dla_layers is None else (set(dla_layers), set(dla_refused))
    timings = []
    for name, times in layer_times_ms.items():
        layer = info.get(name, {"Name": name})
        types = [t.get("Format/Datatype", "") for t in layer.get("Inputs", []) + layer.get("Outputs", [])]
        transfer = requested_device == "dla" and name not in info and is_dla_transfer(name)
        on_dla = requested_device == "dla" and (transfer or _on_dla(layer, placement))
        overhead = _inspector_overhead(layer)
        timings.append({"name": name, "kind": "DLA transfer" if transfer else layer.get("LayerType", "?"),
                        "precision": layer_precision(types),
                        "device": "dla" if on_dla else "gpu", "tactic": layer.get("TacticName"),
                        **({"overhead": overhead} if overhead else {}),
                        **({"samples_ms": list(times)} if isinstance(times, (list, tuple)) else {"total_ms": times})})
    return timings


# ----------------------------------------------------------------- why INT8 may not pay off
def _named(layers: Sequence[LayerTiming], count: int = 3) -> str:
    shown = ", ".join(f"{layer.name} ({layer.kind}, {100 * layer.share:.0f}%)" for layer in layers[:count])
    return shown + (f" and {len(layers) - count} more" if len(layers) > count else "")


def int8_payoff_reasons(table: BatchProfile, runtime: str | None = None) -> list[str]:
    """Why INT8 may not pay off in this engine, each reason in words with the place to look.

    Args:
        table: One batch size's profile of a quantized model.
        runtime: ``tensorrt`` or ``onnxruntime``; None infers it (TensorRT layers carry a tactic).

    Returns:
        One sentence per reason, in this order: overhead above :data:`OVERHEAD_REASON_SHARE`, Q/DQ left
        as layers of their own (unfused), no compute layer in INT8 at all, float islands above
        :data:`FLOAT_ISLAND_SHARE` (when some compute is INT8). Empty for a model without Q/DQ or INT8
        layers (nothing to pay off) and for one where none of these shows.
    """
    layers = table.layers
    qdq = [layer for layer in layers if layer.overhead == "qdq"]
    if not qdq and table.int8_share == 0:
        return []
    tensorrt = (runtime or ("tensorrt" if any(layer.tactic for layer in layers) else "onnxruntime")) == "tensorrt"
    reasons = []
    overhead = [layer for layer in layers if layer.overhead]
    if table.overhead_share > OVERHEAD_REASON_SHARE:
        place = ("the engine's layer list (results.json's profile, or trtexec --dumpLayerInfo "
                 "--profilingVerbosity=detailed): a reformat sits wherever precision or layout changes, so "
                 "between INT8 and float layers and at the engine's I/O" if tensorrt else
                 "results.json's profile: ONNX Runtime runs each Q/DQ it could not fuse into a QLinear* kernel "
                 "as an op of its own")
        reasons.append(f"Q/DQ, reformat and cast layers take {100 * table.overhead_share:.0f}% of the time "
                       f"({_named(overhead)}): this is what INT8 costs before it saves anything; look at {place}.")
    if qdq:
        place = ("TensorRT fuses a DequantizeLinear into the Conv/Gemm it feeds and a QuantizeLinear into the layer "
                 "before it; one left standing sits where it cannot fuse (before an Add, Concat, Resize or a float "
                 "layer, NVIDIA/TensorRT#3205): look at the Q/DQ placement in the quantize stage's student.int8.onnx"
                 if tensorrt else
                 "ONNX Runtime fuses DequantizeLinear → op → QuantizeLinear into a QLinear* kernel only for the "
                 "ops and types its execution provider has; unfused, the op between runs in float: look at the "
                 "provider (TensorRT on the device fuses what the CPU provider does not)")
        reasons.append(f"{len(qdq)} Q/DQ layer(s) run as layers of their own, unfused ({_named(qdq)}); {place}.")
    if qdq and table.int8_share == 0:
        where = ("TensorRT built no INT8 kernel: check that the engine was built with INT8 allowed (the build's "
                 "precision_built and trtexec line) and that each Q/DQ pair sits on a Conv/Gemm input it can fuse into"
                 if tensorrt else
                 "the runtime, not the model, decides this: measure the INT8 rung with TensorRT on the device")
        reasons.append("No compute layer ran in INT8: the Q/DQ only round the values (fake quantization) and the "
                       f"layers between them ran in float, so INT8 costs time here and saves none; {where}.")
    floats = [layer for layer in layers if not layer.overhead and layer.precision in FLOAT_PRECISIONS]
    float_share = sum(layer.share for layer in floats)
    if float_share > FLOAT_ISLAND_SHARE and table.int8_share > 0:
        reasons.append(f"Float layers take {100 * float_share:.0f}% of the time in an INT8 model: {_named(floats)}; "
                       "each float island also needs reformats on its way in and out. Look at the quantize stage's "
                       "attempts[].lint.float_layers in manifest.json (the layers left out of Q/DQ) and quantize "
                       "them or move them to FP16.")
    return reasons


# ----------------------------------------------------------------- the job's pass
def profile_runner(runner, batch_sizes: Sequence[int], chw: Sequence[int], iterations: int = PROFILE_ITERATIONS,
                   warmup: int = PROFILE_WARMUP) -> tuple[dict[str, Any] | None, str | None]:
    """Runs the runner's separate profiling pass at every batch size (after the timed windows).

    Args:
        runner: A loaded runner; profiled only when it has ``profile_batch(batch, iterations, warmup)``
            (returns a :class:`BatchProfile`) and ``profile_meta()`` (source, requested device, notes);
            ``profile_unavailable()``, where present, returns why this installation cannot profile (or None).

    Returns:
        (``Profile.model_dump()`` or None, why there is none or None).

    Each batch's pass runs at most ``iterations`` inferences, fewer when they would take longer than
    :data:`PROFILE_BUDGET_S` (never fewer than :data:`PROFILE_MIN_ITERATIONS`).
    """
    import numpy as np

    if not hasattr(runner, "profile_batch"):
        return None, f"the {getattr(runner, 'name', 'runner')} runner has no per-layer profiler"
    # A runner whose runtime offers no per-layer timing in this installation says why instead of guessing.
    unavailable = getattr(runner, "profile_unavailable", None)
    reason = unavailable() if unavailable else None
    if reason:
        return None, reason
    import time

    rng = np.random.default_rng(1)
    try:
        batches = []
        for size in batch_sizes:
            batch = rng.standard_normal((size, *chw)).astype(np.float32)
            started = time.perf_counter()
            runner.infer(batch)  # one timed call sizes the pass to the budget
            elapsed = time.perf_counter() - started
            count = max(PROFILE_MIN_ITERATIONS, min(iterations, int(PROFILE_BUDGET_S / max(elapsed, 1e-6))))
            batches.append(runner.profile_batch(batch, count, warmup))
        meta = runner.profile_meta()
        profile = Profile(runtime=runner.name, source=meta["source"], requested_device=meta["requested_device"],
                          batches=batches, notes=meta.get("notes", []))
    except Exception as err:  # the timed windows are already measured: a failed profile must not discard them
        return None, f"per-layer profile failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return profile.model_dump(), None
