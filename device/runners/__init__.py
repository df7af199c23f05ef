"""Inference runners behind one interface: load, infer, close (a context manager).

Each runner imports its framework lazily, so ``device`` imports without any of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from device.errors import ConfigError
from device.registry import Registry
from device.runners.base import Runner  # noqa: F401 (the interface, re-exported)


def make_runner(runtime: str, artifact: str, *, precision: str = "fp32", threads: int = 0, batch_sizes=(1,),
                dla_core: int | None = None, engine_cache: str | None = None, channels_last: bool = True,
                cuda_graphs: bool = False, timing_cache: str | None = None, marked: tuple[str, ...] = (),
                trust_programs: bool = False) -> Runner:
    """The runner for ``runtime`` (a key of :data:`RUNNERS`), its framework imported only now.

    Args:
        timing_cache: TensorRT only: a timing cache *name* (``JobSpec.timing_cache``), resolved to one file
            beside the engine cache (:func:`timing_cache_path`).
        marked: ONNX tensors returned besides the outputs (``run_marked``): ONNX Runtime and TensorRT only.
        trust_programs: The torch runners load a ``torch.export`` program (``.pt2``) only when this is set (the agent's
            ``--trust-programs``); device checkpoints load either way.
    """
    if marked and runtime not in ("onnxruntime", "tensorrt"):
        raise ConfigError(f"runtime {runtime!r} cannot mark ONNX tensors as outputs",
                          fix="run the debug job with runtime tensorrt or onnxruntime")
    return RUNNERS.get(runtime)(artifact, precision=precision, threads=threads, batch_sizes=tuple(batch_sizes),
                                dla_core=dla_core, engine_cache=engine_cache, channels_last=channels_last,
                                cuda_graphs=cuda_graphs, timing_cache=timing_cache, marked=tuple(marked),
                                trust_programs=trust_programs)


def timing_cache_path(engine_cache: str | None, name: str | None) -> str | None:
    """The file of timing cache ``name``: ``<engine cache>/timing/<name>.cache`` (None without a name or a cache).

    A name, not a path, crosses the wire: the client chooses which builds share a cache, the agent where it
    lives. TensorRT reads it before a build and writes it back atomically after (device.runners.engine), and the agent
    runs one job at a time, so the builds sharing it never race.
    """
    if not name or not engine_cache:
        return None
    folder = Path(engine_cache) / "timing"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{name}.cache")


def _onnxruntime(artifact: str, *, threads: int, marked: tuple[str, ...] = (), **_: Any) -> Runner:
    from device.runners.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner(artifact, providers=("CUDAExecutionProvider", "CPUExecutionProvider"), threads=threads,
                             marked=marked)


def _tensorrt(artifact: str, *, precision: str, batch_sizes: tuple[int, ...], dla_core: int | None,
              engine_cache: str | None, timing_cache: str | None = None, marked: tuple[str, ...] = (),
              **_: Any) -> Runner:
    from device.runners.trt_settings import BuildOptions
    from device.runners.tensorrt import TensorRTRunner

    # One engine per measured batch, each with opt = that batch (BuildOptions.for_batch): the kernels
    # timed at batch 1 are the ones tuned for batch 1, not for the largest batch.
    options = BuildOptions(precision=precision, dla_core=dla_core,
                           timing_cache=timing_cache_path(engine_cache, timing_cache), mark_outputs=marked)
    return TensorRTRunner(artifact, options, cache_dir=engine_cache, batch_sizes=batch_sizes)


def _torch(artifact: str, *, precision: str, channels_last: bool, cuda_graphs: bool, threads: int,
           trust_programs: bool, **_: Any) -> Runner:
    from device.runners.torch import TorchRunner

    return TorchRunner(artifact, precision=precision, channels_last=channels_last, cuda_graphs=cuda_graphs,
                       threads=threads, trust_programs=trust_programs)


def _torch_tensorrt(artifact: str, *, precision: str, batch_sizes: tuple[int, ...], engine_cache: str | None,
                    trust_programs: bool, **_: Any) -> Runner:
    from device.runners.torch_tensorrt import TorchTensorRTRunner

    # Static shapes, one compiled module per measured batch, as the TensorRT runner builds one engine per batch.
    return TorchTensorRTRunner(artifact, precision=precision, batch_sizes=batch_sizes, cache_dir=engine_cache,
                               trust_programs=trust_programs)


RUNNERS: Registry = Registry("runtime")
RUNNERS.add("onnxruntime", _onnxruntime)
RUNNERS.add("tensorrt", _tensorrt)
RUNNERS.add("torch", _torch)
RUNNERS.add("torch_tensorrt", _torch_tensorrt)
