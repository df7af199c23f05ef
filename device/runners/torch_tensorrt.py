"""Torch-TensorRT runner: compiles a ``torch.export`` program (``.pt2``) on this device, one static engine set
per measured batch, and runs it — the PyTorch user's road to TensorRT, beside the ONNX road
(:mod:`device.runners.tensorrt`).

Torch-TensorRT's API moves between releases (JetPack 6's builds: jetson-containers'
packages/pytorch/torch_tensorrt/config.py@1791966 builds branch lluo/jp6.1, the 2.4–2.5 era, below JetPack 6.2 and
v2.9.0 from 6.2; the wheel pytorch/TensorRT documents for JetPack 6.2 is 2.8.0, docsrc/getting_started/
jetpack.rst@v2.9.0, which docker/platforms.py installs; PyPI's newest is 2.14), so
everything this runner asks of it that depends on the release is in ONE table
(:data:`device.runners.torch_tensorrt_rules.RULES`), each rule with the file and tag of the ``pytorch/TensorRT``
sources it was read from; ``rules_for`` picks the rules of the release installed, and the result says which release
and rules ran.

What it does, per job:

1. Reads the program's serialization schema and torch version from the archive (no torch needed) and refuses,
   naming both versions, a program this device's torch cannot load (:func:`check_program_versions`).
2. Loads it through :func:`device.runners.export_load.load_program` (the agent's upload check made again: ATen and
   quantize operators only, integer shape expressions, tensor-only pickles; then ``torch.export.load`` with every
   unpickling weights-only and its ``weights_only=False`` fallback refused) and reads its precision from the graph: INT8 when it carries ModelOpt's
   quantizer ops (``tensorrt.quantize_op``), FP16 when its weights are half, else FP32; the job's precision
   must agree, except that an FP32 program may be run in FP16 (the runner casts the module, then the graph
   is FP16 before it is compiled, so what is compiled is what is timed).
   Or, given a device checkpoint (``.device.pt``: state, architecture key, input C×H×W; for the INT8 rung also
   ModelOpt's quantizer state calibrated on the build host), rebuilds the rung with :mod:`device.models.architectures`
   and :mod:`device.uploads.torch_checkpoint` and exports it with this device's own torch: for a device whose torch
   cannot load the build host's program, and always for INT8 (ModelOpt's export needs CUDA, under
   ``export_torch_mode``; rules ``int8_export``).
3. For each measured batch: re-exports the module at that static shape on the GPU, compiles it with
   ``torch_tensorrt.dynamo.compile`` (``Input(shape=…)``: min = opt = max), counts the ops left to PyTorch
   (:func:`fallback_report`) and saves the compiled program with ``torch_tensorrt.save`` into the engine
   cache, keyed like TensorRT engines (:class:`device.runners.engine.EngineCache`: artifact sha256, device
   fingerprint, options) with the Torch-TensorRT and torch versions added to the fingerprint.

4. Where the job asks for the per-layer profile: times each TensorRT engine's layers with Torch-TensorRT's own
   engine profiler (:mod:`device.runners.torch_tensorrt_profile`, rules ``engine_profiler*``), or says why it
   cannot (no C++ runtime, no engine) instead of filling the table with guesses.

What loading trusts: torch's operators, its weights-only unpickler, ModelOpt's quantize op when the program names it,
and the compiled programs in the engine cache, which this runner wrote itself (``torch_tensorrt.load`` of those runs
their pickles unrestricted: the cache directory must stay the agent's own). A device checkpoint is read by
:func:`device.uploads.torch_checkpoint.read_payload`: the upload's pickle check again, then ``torch.load(weights_only=True)``.

torch and torch_tensorrt are imported only in :meth:`TorchTensorRTRunner.load`, so ``device`` imports without them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from device.runners.engine import BuildOptions, EngineCache, detect_gpu, fingerprint, read_l4t
from device.errors import (ConfigError, DeviceError, EngineBuildError, PrecisionMismatchError,
                           ProgramVersionError, RunnerError, ShapeOutsideProfileError, require)
from device.files import sha256_file, write_atomic
from device.runners.base import Runner, engine_facts
from device.runners.export_load import artifact_kind, load_checkpoint_module, load_program, program_module
from device.runners.torch_tensorrt_rules import Rule, compile_arguments, rules_for

DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "float32"}  # an INT8 program keeps float I/O
QUANTIZE_OP = "tensorrt.quantize_op"  # the op ModelOpt's export_torch_mode() leaves in a quantized graph


def cuda_pci_bus_id(torch, index: int = 0) -> str | None:
    """GPU ``index``'s PCI bus id (``00000000:01:00.0``, NVML's form): from torch's device properties where its build
    has the PCI fields (torch's own stubs do not list them, and older Jetson wheels lack them), else from the CUDA
    runtime (``cudaDeviceGetPCIBusId``)."""
    props = torch.cuda.get_device_properties(index)
    fields = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if all(isinstance(value, int) for value in fields):
        return f"{fields[0]:08X}:{fields[1]:02X}:{fields[2]:02X}.0"
    try:
        from device.runners.cuda import CudaRuntime

        return CudaRuntime().pci_bus_id(index)
    except Exception:  # noqa: BLE001 (no libcudart found: NVML then falls back to its first GPU, and says so)
        return None


# ------------------------------------------------------------------ the program's versions (no torch)
@dataclass(frozen=True)
class ProgramVersions:
    """What a ``.pt2`` says about who wrote it."""

    schema: tuple[int, int] | None
    torch: str | None
    quantized: bool


def read_program_versions(path: str | os.PathLike) -> ProgramVersions:
    """Reads the serialization schema, the torch version and whether ModelOpt quantizer ops are present,
    from the archive itself (``models/*.json``; EdgeFold's ``extra/edgefold.json`` when the build side wrote it).

    Raises:
        DeviceError: Not a ``torch.export`` archive.
    """
    from device.uploads.archive_check import MAX_EXTRA_BYTES, MAX_EXTRA_DEPTH, MAX_JSON_BYTES, load_json

    fix = "save it with torch.export.save(torch.export.export(model, args), path)"
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            model = next((e for e in entries if re.search(r"(^|/)models/[^/]+\.json$", e.filename)), None)
            if model is None:
                raise DeviceError(f"{path} is not a torch.export program (no models/*.json in the archive)", fix=fix)
            extra = next((e for e in entries if e.filename.endswith("extra/edgefold.json")), None)
            # Bounded as the upload check bounds them: this runs on files nothing has checked yet (a runner used
            # directly) and must not be the parser a crafted document exhausts.
            if model.file_size > MAX_JSON_BYTES or (extra is not None and extra.file_size > MAX_EXTRA_BYTES):
                raise DeviceError(f"{path}: its documents exceed the upload check's bounds", fix=fix)
            document = load_json(archive.read(model), model.filename)
            recorded = load_json(archive.read(extra), extra.filename, max_depth=MAX_EXTRA_DEPTH) if extra else {}
    except zipfile.BadZipFile:
        raise DeviceError(f"{path} is not a torch.export program (not a zip archive)", fix=fix) from None
    except ValueError as err:
        raise DeviceError(f"{path} is not a readable torch.export program: {err}", fix=fix) from None
    if not isinstance(document, dict) or not isinstance(recorded, dict):
        raise DeviceError(f"{path} is not a torch.export program (its documents are not JSON objects)", fix=fix)
    text = json.dumps(document)
    schema = document.get("schema_version") or {}
    version = (int(schema["major"]), int(schema["minor"])) if "major" in schema else None
    return ProgramVersions(version, recorded.get("torch") or document.get("torch_version"), QUANTIZE_OP in text)


def check_program_versions(program: ProgramVersions, torch_version: str, schema: Sequence[int]) -> list[str]:
    """Refuses a program this device's torch cannot deserialize; returns notes for the risky cases.

    torch's own rule (torch/_export/serde/serialize.py, ExportedProgramDeserializer.deserialize): a different
    schema MAJOR is refused. A newer MINOR passes that check but may carry fields the older reader lacks:
    noted here, and a failed load then names both versions too.

    Raises:
        ProgramVersionError: Naming the program's torch and schema and the device's.
    """
    device_schema = (int(schema[0]), int(schema[1]))
    if program.schema is None:
        return [f"the program records no serialization schema (written by torch {program.torch or 'unknown'})"]
    wrote = f"torch {program.torch or 'unknown'} (serialization schema {program.schema[0]}.{program.schema[1]})"
    here = f"torch {torch_version} (schema {device_schema[0]}.{device_schema[1]})"
    if program.schema[0] != device_schema[0]:
        raise ProgramVersionError(
            f"the program was exported by {wrote}; this device has {here}, which cannot load it",
            fix=f"send the rung's device checkpoint (<rung>.device.pt), which this device exports with its own torch "
                f"{torch_version} (EdgeFold's deploy does when the agent's torch is another release), or install torch "
                f"{program.torch or 'of the build host'} on the device")
    if program.schema > device_schema:
        return [f"the program was exported by {wrote}, newer than this device's {here}: loads if it uses no newer "
                "field"]
    return []


# ------------------------------------------------------------------ what fell back to PyTorch
def fallback_report(compiled, engine_prefix: str = "_run_on_acc") -> dict[str, Any]:
    """The ops a compiled module runs in PyTorch, by name and count, and its TensorRT engine submodules.

    Children named ``engine_prefix…`` are TensorRT modules; every other GraphModule child, and the top graph
    (the global partitioner leaves unsupported nodes there), runs in PyTorch: their call_function/call_method
    nodes, less ``operator.getitem`` (a tuple access, not an op), are what fell back — Torch-TensorRT's own
    count in dryrun mode (see :data:`device.runners.torch_tensorrt_rules.RULES`, ``fallback_nodes``).
    """
    import operator

    engines, ops = [], Counter()

    def count(graph) -> None:
        for node in graph.nodes:
            if node.op in ("call_function", "call_method") and node.target is not operator.getitem:
                ops[str(getattr(node.target, "__name__", node.target)) if node.op == "call_method"
                    else str(node.target)] += 1

    for name, child in compiled.named_children():
        if name.startswith(engine_prefix):
            engines.append(name)
        elif getattr(child, "graph", None) is not None:
            count(child.graph)
    if getattr(compiled, "graph", None) is not None:
        count(compiled.graph)
    return {"engines": len(engines), "engine_submodules": engines, "fallback_ops": dict(sorted(ops.items())),
            "fallback_count": int(sum(ops.values()))}


def program_precision(module, quantized: bool) -> str:
    """``int8`` for a graph with ModelOpt quantizer ops, ``fp16`` when most float weights are half, else ``fp32``."""
    if quantized:
        return "int8"
    floats = [p.dtype for p in module.state_dict().values() if getattr(p, "is_floating_point", lambda: False)()]
    half = sum(str(d) in ("torch.float16", "torch.bfloat16") for d in floats)
    return "fp16" if floats and half * 2 > len(floats) else "fp32"


def reconcile(requested: str, artifact: str, version: str) -> str:
    """The precision to compile: the program's own, or FP16 cast from an FP32 program by the runner.

    Raises:
        PrecisionMismatchError: The job asks for a precision the program cannot be run in honestly.
    """
    if requested == artifact or (requested == "fp16" and artifact == "fp32"):
        return requested
    if artifact == "int8":
        what, fix = "the program carries ModelOpt quantizers (INT8)", "send precision int8 with this program"
    elif requested == "int8":
        what = "the program has no ModelOpt quantizer ops: it would be compiled in float and reported as INT8"
        fix = ("send the INT8 rung's device checkpoint (student.int8.device.pt: the student and ModelOpt's quantizer "
               "state), which the device restores and exports under export_torch_mode")
    else:
        what, fix = f"the program is {artifact}", f"send precision {artifact}"
    raise PrecisionMismatchError(f"the job asks for {requested} but {what} (Torch-TensorRT {version})", fix=fix)


def compute_device(torch):
    """The device Torch-TensorRT compiles for: the CUDA GPU (the tests' stand-in replaces this function).

    Raises:
        DeviceError: On a host without CUDA.
    """
    if not torch.cuda.is_available():
        raise DeviceError("Torch-TensorRT compiles for a CUDA GPU and this host has none",
                          fix="use runtime 'torch' or 'onnxruntime' on a CPU-only host")
    return torch.device("cuda")


def _optional_version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # noqa: BLE001 (absent or broken: the fingerprint says unknown)
        return None


class CompiledCache(EngineCache):
    """Compiled Torch-TensorRT programs under the engine cache's folder rules."""

    filename = "compiled.pt2"


class TorchTensorRTRunner(Runner):
    """Compiles a ``torch.export`` program with Torch-TensorRT at each measured batch, and runs it.

    Args:
        path: The ``.pt2`` file.
        precision: ``fp32``, ``fp16`` or ``int8``; must agree with the program (:func:`reconcile`).
        batch_sizes: The batches the job measures: one compiled module each (static shapes).
        cache_dir: Cache folder (default: ``engines/`` beside the program).
        trust_programs: Load a ``.pt2`` (the agent's ``--trust-programs``); off, only device checkpoints load.
    """

    name = "torch_tensorrt"

    def __init__(self, path: str | os.PathLike, precision: str = "fp32", batch_sizes: Sequence[int] = (1,),
                 cache_dir: str | os.PathLike | None = None, trust_programs: bool = False):
        if precision not in DTYPES:
            raise ConfigError(f"the torch_tensorrt runner runs fp32, fp16 or int8, not {precision!r}",
                              fix="use precision fp32, fp16 or int8")
        self.path, self.precision, self.trust_programs = str(path), precision, trust_programs
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.cache = CompiledCache(cache_dir or Path(path).parent / "engines")
        self._modules: dict[int, Any] = {}
        self.engine_keys: dict[int, str] = {}
        self.engine_path: Path | None = None
        self.built_now = False
        self.precision_built: str | None = None
        self.pci_bus_id: str | None = None
        self.torch_tensorrt: dict[str, Any] = {}
        self.rules: dict[str, Rule] = {}
        self._profile_detailed = False
        self.quantized = False

    def load(self) -> None:
        from device.uploads.artifacts import verify

        kind = artifact_kind(self.path)
        if kind == "torch-export":  # refused or checked before anything imports torch or reads the archive
            verify(self.path, "torch-export", self.trust_programs)
        torch = require("torch", "PyTorch", "pip install 'edgefold[torch-tensorrt]' (JetPack: NVIDIA's torch wheel)")
        tt = require("torch_tensorrt", "Torch-TensorRT",
                     "pip install 'edgefold[torch-tensorrt]' on x86/SBSA; on JetPack 6 (L4T 36.4/36.5) make bundle "
                     "or docker-jetson with TORCH_TENSORRT=1 (docker/README.md)")
        self.torch, self.tt = torch, tt
        rules = self.rules = rules_for(tt.__version__)
        from torch._export.serde.schema import SCHEMA_VERSION

        self.device = compute_device(torch)
        if self.device.type == "cuda":
            self.pci_bus_id = cuda_pci_bus_id(torch)
        if kind == "torch-checkpoint":
            module, artifact, notes, source = self._from_checkpoint(torch)
            versions = ProgramVersions(None, None, artifact == "int8")
        else:
            versions = read_program_versions(self.path)
            notes = check_program_versions(versions, torch.__version__, SCHEMA_VERSION)
            program = self._load_program(torch, versions, SCHEMA_VERSION)
            module = program_module(program, self.path)
            artifact = program_precision(module, versions.quantized)
            self.input_chw = self._input_chw(program)
            source = {"artifact": "torch.export program", "exported_on_device": False}
        self.quantized = versions.quantized
        if self.quantized and "int8_export" not in rules:
            raise ConfigError(f"Torch-TensorRT {tt.__version__} has no INT8 path through ModelOpt (before 2.5 its only "
                              "quantized example is FP8: examples/dynamo/vgg16_fp8_ptq.py@v2.3.0)",
                              fix="install Torch-TensorRT ≥ 2.5 (JetPack 6.2: 2.8.0 via TORCH_TENSORRT=1), or measure "
                                  "the INT8 rung on the ONNX road")
        self.precision_built = reconcile(self.precision, artifact, tt.__version__)
        self.dtype = getattr(torch, DTYPES[self.precision_built])
        gpu, capability = detect_gpu(pci_bus_id=self.pci_bus_id)
        fp = fingerprint(_optional_version("tensorrt") or "unknown", gpu, capability, read_l4t())
        arguments = {k: list(v) if isinstance(v, tuple) else v for k, v in compile_arguments(rules, self.precision_built).items()}
        fp.update({"torch_tensorrt": tt.__version__, "torch": torch.__version__, "compile_arguments": arguments})
        sha = sha256_file(self.path)
        reports: dict[int, Any] = {}
        for batch in self.batch_sizes:
            options = BuildOptions(precision=self.precision_built, batch=(batch, batch, batch))
            path, built = self.cache.get_or_build(
                self.path, sha, fp, options,
                lambda _src, _opts, out, b=batch: self._compile(module, b, rules, out))
            record = json.loads((path.parent / "build.json").read_text())
            reports[batch] = record
            self._modules[batch] = tt.load(str(path)).module().to(self.device)
            self.engine_keys[batch] = path.parent.name
            self.built_now = self.built_now or built
        self.engine_path = path.parent
        first = reports[self.batch_sizes[0]]
        self.torch_tensorrt = {
            "version": tt.__version__, "torch": torch.__version__, "program_torch": versions.torch,
            "program_schema": list(versions.schema) if versions.schema else None,
            "rules": {name: rule.source for name, rule in sorted(rules.items())},
            "compile_arguments": {b: r["compile_arguments"] for b, r in reports.items()},
            "fallback": {b: r["fallback"] for b, r in reports.items()},
            "fallback_count": first["fallback"]["fallback_count"], "notes": notes, **source}
        if self.precision_built == "int8":  # the ONNX road's INT8 has FP16 float islands: say where this one differs
            self.torch_tensorrt["int8_float_islands"] = rules["int8_float_islands"].value

    def _load_program(self, torch, versions: ProgramVersions, schema):
        """``torch.export.load`` of the ``.pt2``, a failure named with both torch versions."""
        if versions.quantized:
            # The quantize op is ModelOpt's: it must be registered before the program is deserialized.
            require("modelopt.torch.quantization", "NVIDIA ModelOpt",
                    "pip install nvidia-modelopt (Torch-TensorRT compiles INT8 programs through ModelOpt's op)")
        from device.uploads.artifacts import UnsafeArtifactError

        try:
            return load_program(torch, self.path, self.trust_programs, verified=True)
        except UnsafeArtifactError:
            raise
        except Exception as err:  # torch raises several types for a foreign or truncated archive
            if versions.schema == tuple(schema)[:2] and versions.torch in (None, torch.__version__):
                raise RunnerError(f"torch {torch.__version__} could not load {Path(self.path).name}: {err}",
                                  fix="re-export the program (torch.export.save)") from None
            raise ProgramVersionError(
                f"torch {torch.__version__} (schema {schema[0]}.{schema[1]}) could not load "
                f"{Path(self.path).name}, exported by torch {versions.torch or 'unknown'} (schema {versions.schema}): "
                f"{err}", fix=f"send the rung's device checkpoint (<rung>.device.pt), which this device exports with its "
                              f"own torch {torch.__version__}, or match the build host's torch") from None

    def _from_checkpoint(self, torch):
        """The rung rebuilt from its device checkpoint with this device's torch: the float student, or the student
        with ModelOpt's quantizers restored (INT8), exported here at each measured batch.

        Raises:
            DeviceError: An INT8 checkpoint on a host without CUDA (ModelOpt's export needs CUDA tensors).
        """
        module, facts = load_checkpoint_module(self.path)
        if facts["input_chw"] is None:
            raise ConfigError(f"{Path(self.path).name} records no input_chw: the device cannot export it at a static "
                              "shape", fix="send the .device.pt the pipeline's export or quantize stage wrote")
        if facts["quantized"] and self.device.type != "cuda":
            raise DeviceError("ModelOpt's INT8 export through torch.export needs CUDA tensors (on CPU its quantizers "
                              "keep the legacy fake quantization, which torch.export rejects)",
                              fix="run the INT8 rung of the Torch-TensorRT road on a device with a CUDA GPU")
        self.input_chw = facts["input_chw"]
        notes = [f"exported on the device by torch {torch.__version__} from the checkpoint ({facts['arch']}"
                 + (f", ModelOpt {facts['modelopt']} quantizer state" if facts["quantized"] else "") + ")"]
        source = {"artifact": "device checkpoint", "exported_on_device": True, "arch": facts["arch"],
                  "modelopt": facts["modelopt"]}
        return module, "int8" if facts["quantized"] else "fp32", notes, source

    def _input_chw(self, program) -> tuple[int | None, ...]:
        example = program.example_inputs[0][0] if program.example_inputs else None
        if example is not None:
            return tuple(int(d) for d in example.shape[1:])
        placeholder = next(n for n in program.graph.nodes if n.op == "placeholder"
                           and n.name in program.graph_signature.user_inputs)
        return tuple(int(d) if isinstance(d, int) else None for d in placeholder.meta["val"].shape[1:])

    def _compile(self, module, batch: int, rules: dict[str, Rule], out: Path) -> None:
        """Re-exports ``module`` at ``batch`` on the GPU in the compiled precision, compiles it, saves it to ``out``
        and writes ``build.json`` (arguments, fallback report, release rules) beside it."""
        torch, tt = self.torch, self.tt
        if any(d is None for d in self.input_chw):
            raise ConfigError(f"the program's input has dynamic dimensions besides the batch: {self.input_chw}",
                              fix="export with a fixed C×H×W (only the batch axis dynamic)")
        shape = (batch, *self.input_chw)
        moved = module.to(self.device, self.dtype) if self.precision_built == "fp16" else module.to(self.device)
        example = torch.zeros(shape, dtype=self.dtype, device=self.device)
        arguments = compile_arguments(rules, self.precision_built)
        resolved = {key: {getattr(torch, name) for name in value} if key == "enabled_precisions" else value
                    for key, value in arguments.items()}
        inputs = [tt.Input(shape=shape, dtype=self.dtype)]
        try:
            # A static re-export on the device: the graph compiled is the one timed, in the precision it is timed in.
            # ModelOpt's quantizers export as tensorrt.quantize_op only under its export_torch_mode; export and
            # compile both run inside it (RULES int8_export).
            with torch.no_grad(), self._export_mode():
                static = self._export(moved, example, rules)
                compiled = tt.dynamo.compile(static, inputs=inputs, **resolved)
        except TypeError:
            raise  # a release rule that is wrong for this build: a bug to fix here, never retried
        except Exception as err:  # converters and TensorRT raise their own types
            raise EngineBuildError(f"Torch-TensorRT {tt.__version__} could not compile {Path(self.path).name} at "
                                   f"batch {batch}: {err}",
                                   fix="see the job log; ops without converters fall back to PyTorch, a failing "
                                       "converter does not") from None
        report = fallback_report(compiled, rules["engine_prefix"].value)
        tt.save(compiled, str(out), arg_inputs=[example], **rules["save"].value)
        shown = {key: sorted(value) if isinstance(value, tuple) else value for key, value in arguments.items()}
        record = {"torch_tensorrt": tt.__version__, "torch": torch.__version__, "batch": batch,
                  "precision": self.precision_built,
                  "compile_arguments": {"inputs": f"[Input(shape={shape}, dtype={self.dtype})]", **shown},
                  "fallback": report}
        write_atomic(out.parent / "build.json", json.dumps(record, indent=1, default=str) + "\n")

    def _export(self, module, example, rules: dict[str, Rule]):
        """``torch.export`` of ``module`` at the example's static shape; a quantized module the way its release's
        INT8 example does it (:data:`device.runners.torch_tensorrt_rules.RULES` ``int8_export``)."""
        torch = self.torch
        if self.quantized and rules["int8_export"].value == "torch.export._trace._export":
            from torch.export._trace import _export

            return _export(module, (example,))
        return torch.export.export(module, (example,), strict=False)

    def _export_mode(self):
        """ModelOpt's ``export_torch_mode()`` for a quantized module, else nothing."""
        import contextlib

        if not self.quantized:
            return contextlib.nullcontext()
        utils = require("modelopt.torch.quantization.utils", "NVIDIA ModelOpt",
                        "pip install nvidia-modelopt (the INT8 rung's quantizers are ModelOpt's)")
        return utils.export_torch_mode()

    def infer(self, batch: np.ndarray) -> np.ndarray:
        module = self._modules.get(batch.shape[0])
        if module is None:
            raise ShapeOutsideProfileError(f"no compiled module for batch {batch.shape[0]} (compiled: "
                                           f"{list(self._modules)})", fix="measure the batch sizes the job names")
        torch = self.torch
        with torch.inference_mode():
            tensor = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)).to(self.device, self.dtype)
            out = module(tensor)
            if isinstance(out, (tuple, list)):
                out = out[0]
            return out.float().cpu().numpy()  # .cpu() synchronizes: the latency includes the GPU's work

    # ------------------------------------------------------------- per-layer profile
    def profile_unavailable(self) -> str | None:
        """Why this installation cannot time layers (no engine profiler, no C++ runtime, no engine), or None."""
        from device.runners.torch_tensorrt_profile import unavailable

        features = getattr(self.tt, "ENABLED_FEATURES", None)  # torch_tensorrt/__init__.py re-exports _features.py's
        return unavailable(self.tt.__version__, self.rules, bool(getattr(features, "torch_tensorrt_runtime", False)),
                           list(self._modules.values()))

    def profile_batch(self, batch: np.ndarray, iterations: int, warmup: int):
        """Per-layer times (a :class:`device.jobs.profile.BatchProfile`) of the compiled module's TensorRT engines at this
        batch, from Torch-TensorRT's own engine profiler, in a separate pass (it makes every enqueue synchronous)."""
        from device.runners.torch_tensorrt_profile import profile_engines

        module = self._modules.get(batch.shape[0])
        if module is None:
            raise ShapeOutsideProfileError(f"no compiled module for batch {batch.shape[0]}",
                                           fix="profile the batch sizes the job measures")
        table, detailed = profile_engines(module, lambda: self.infer(batch), batch.shape[0], iterations, warmup,
                                          self.rules["engine_profiler"].value)
        self._profile_detailed = detailed
        return table

    def profile_meta(self) -> dict[str, Any]:
        spec = self.rules["engine_profiler"].value
        fallback = self.torch_tensorrt.get("fallback", {}).get(self.batch_sizes[0], {})
        notes = []
        if fallback.get("fallback_count"):
            ops = ", ".join(f"{op} x{count}" for op, count in fallback["fallback_ops"].items())
            notes.append(f"TensorRT engines only: {fallback['fallback_count']} op(s) fell back to PyTorch ({ops}) and "
                         "run between the engines, outside this table (the latency less the table's total bounds "
                         "their time)")
        if not self._profile_detailed:
            notes.append("layer precisions unknown: Torch-TensorRT builds its engines with ProfilingVerbosity."
                         "LAYER_NAMES_ONLY outside debugging, so its layer information names layers only "
                         "(py/torch_tensorrt/dynamo/conversion/_TRTInterpreter.py; RULES layer_information)")
        return {"source": f"Torch-TensorRT {self.tt.__version__} engine profiler (Engine.enable_profiling with "
                          f"profile_path_prefix; *{spec['trace_suffix']} in its {spec['format']} format and "
                          f"*{spec['layer_information_suffix']}), a separate pass",
                "requested_device": "gpu", "notes": notes}

    def runtime_facts(self) -> dict[str, Any]:
        return engine_facts(self, torch_tensorrt=self.torch_tensorrt)

    def close(self) -> None:
        self._modules = {}
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()
