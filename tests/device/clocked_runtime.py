"""A STAND-IN runtime for sweep tests — not TensorRT, not a GPU: the TensorRT stand-in (``trt_standin``) whose
time per call scales with the simulated board's GPU clock.

On this host a real runtime's latency does not change with the simulated power mode, so a sweep through the real
agent and the real jtop service could not recover anything. Here every ``execute_async_v3`` sleeps a PLANTED
time: a fixed part plus a part per image, both in GPU cycles, divided by the GPU clock the simulated board runs
at now (its devfreq ``cur_freq``, which the simulated ``nvpmodel`` caps and ``jetson_clocks`` pins to the cap).
A DLA engine's image costs more cycles (:data:`DLA_FACTOR`); the simulation has no DLA clock, so the DLA's time
follows the GPU clock too (synthetic). With the board's planted rail powers (``jetson_sim.AGX_ORIN_MODES``,
synthetic) every point's latency and energy per image are known in advance (:func:`planted_point`), so a test
can check that the sweep finds the most efficient planted point.

The agent runs each job in a child process, so the stand-in is installed there by a ``sitecustomize`` module
(:func:`sitecustomize_dir`) on the agent's ``PYTHONPATH``; it reads the board from ``EDGEFOLD_TEST_CLOCKED_*``
variables, which nothing outside these tests sets.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from tests.device.jetson_sim import gpu_devfreq, rail_power_mw
from tests.device.time_scale import ENV_SCALE, TimeScale

# Planted work of one call, in GPU cycles: FIXED_CYCLES per call plus IMAGE_CYCLES per image (× DLA_FACTOR on a
# DLA). At MAXN's 1300.5 MHz a batch-1 call takes 3 ms, a batch-4 call 6 ms.
FIXED_CYCLES = 2.601e6
IMAGE_CYCLES = 1.3005e6
DLA_FACTOR = 2.0
_ENV_ROOT, _ENV_VERSION, _ENV_DLA, _ENV_BOARD = ("EDGEFOLD_TEST_CLOCKED_ROOT", "EDGEFOLD_TEST_CLOCKED_TRT",
                                                 "EDGEFOLD_TEST_CLOCKED_DLA_CORES", "EDGEFOLD_TEST_CLOCKED_BOARD")


def planted_call_s(dla_core: int | None, batch: int, gpu_hz: float) -> float:
    """Seconds one call of ``batch`` images takes at ``gpu_hz`` (on DLA core ``dla_core``, or the GPU)."""
    per_image = IMAGE_CYCLES * (DLA_FACTOR if dla_core is not None else 1.0)
    return (FIXED_CYCLES + per_image * batch) / gpu_hz


def board_power_mw(mode: dict, rails: list[tuple[str, int, int]], rails_2: list[tuple[str, int, int]]) -> float:
    """The board total jtop reads in ``mode`` on a board without an input rail (AGX Orin): the sum of every
    monitored rail, the mode's planted currents on the first two channels."""
    first = [(label, mv, ma) for (label, mv, _), ma in zip(rails, mode["rails_ma"])] + rails[len(mode["rails_ma"]):]
    return float(sum(rail_power_mw(mv, ma) for label, mv, ma in first + list(rails_2) if label != "NC"))


def planted_point(mode: dict, batch: int, accelerator: str, board: dict) -> dict:
    """What a point should measure with jetson_clocks on (the GPU at the mode's cap): p50 in ms and energy per
    image in mJ, from the planted call time and the planted board power alone."""
    call_s = planted_call_s(None if accelerator == "gpu" else int(accelerator[3:]), batch, mode["gpu_max_hz"])
    power_mw = board_power_mw(mode, board["rails"], board.get("rails_2", []))
    return {"mode": mode["name"], "batch_size": batch, "accelerator": accelerator, "latency_p50_ms": 1e3 * call_s,
            "energy_mj_per_image": power_mw * call_s / batch}


def install_in_process(root: str | os.PathLike, version: str = "10.3.0", dla_cores: int = 0,
                       board: str | None = None):
    """Installs the clocked stand-in in this process (no monkeypatch: a job process lives only for its job); with no
    ``root`` (no simulated board) its calls take what the numpy graph takes, unclocked."""
    import device.runners.cuda
    import device.runners.engine
    import device.runners.tensorrt
    from tests.device import trt_standin

    trt = trt_standin.make_tensorrt(version, dla_cores)
    if root:
        clock = gpu_devfreq(root) / "cur_freq"
        trt.planted_call_s = lambda dla_core, batch: planted_call_s(dla_core, batch, float(clock.read_text()))
    # Found as installed (device.info.tensorrt_status asks importlib.util.find_spec, which reads the module's spec):
    # the agent then reports TensorRT, and the pipeline's deploy chooses it as on a Jetson.
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None, origin=__file__)
    sys.modules["tensorrt"] = trt
    device.runners.tensorrt.CudaRuntime = device.runners.cuda.CudaRuntime = trt_standin.FakeCuda
    device.runners.engine.board_model = lambda *a, **k: board
    device.runners.tensorrt.detect_gpu = lambda **_: (trt_standin.STANDIN_DEVICE, "8.7")
    return trt


def sitecustomize_dir(folder: Path, root: Path | None, version: str = "10.3.0", dla_cores: int = 0,
                      board: str | None = None, clock: TimeScale | None = None) -> tuple[Path, dict[str, str]]:
    """A folder holding a ``sitecustomize`` that installs the clocked stand-in, and the environment an agent needs
    for its job processes to pick it up (``PYTHONPATH`` first, then the repository). ``root`` None: no simulated
    board, the stand-in unclocked. ``clock``: the job processes run on that simulated clock."""
    folder.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    (folder / "sitecustomize.py").write_text(
        "# STAND-IN for TensorRT in EdgeFold's sweep tests (tests/device/clocked_runtime.py)\n"
        "import os\n"
        f"if {ENV_SCALE!r} in os.environ:  # a simulated clock in the job processes (tests/device/time_scale.py)\n"
        "    from tests.device.time_scale import install_in_job_process\n"
        "    install_in_job_process()\n"
        f"if {_ENV_ROOT!r} in os.environ:\n"
        f"    from tests.device.clocked_runtime import install_from_environment\n"
        "    install_from_environment()\n")
    env = {"PYTHONPATH": os.pathsep.join([str(folder), str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           _ENV_ROOT: str(root or ""), _ENV_VERSION: version, _ENV_DLA: str(dla_cores), _ENV_BOARD: board or "",
           **(clock.environment() if clock else {})}
    return folder, env


def install_from_environment() -> None:
    """What the ``sitecustomize`` runs: the stand-in for the board the environment names."""
    install_in_process(os.environ[_ENV_ROOT], os.environ.get(_ENV_VERSION, "10.3.0"),
                       int(os.environ.get(_ENV_DLA, "0")), os.environ.get(_ENV_BOARD) or None)
