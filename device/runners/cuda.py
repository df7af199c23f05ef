"""The few CUDA runtime calls EdgeFold makes, through ctypes: a TensorRT runner's memory, streams and events, and
the PCI bus id that tells NVML which GPU the process's CUDA device 0 is.

Its own module so that telemetry (NVML) can ask for the bus id without importing a runner.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import site
import sys
from pathlib import Path
from typing import Sequence

from device.errors import MissingDependencyError, RunnerError

H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


def cudart_candidates(site_dirs: Sequence[str] | None = None, maps: str | None = None) -> list[str]:
    """Where libcudart may be, most specific first.

    pip-installed TensorRT depends on ``nvidia-cuda-runtime-cu12/13``, which ship only
    ``libcudart.so.12``/``.so.13`` under ``site-packages/nvidia/…/lib`` (no plain ``libcudart.so``, not
    on the ldconfig path) and TensorRT has already loaded it: the copy in this process comes first
    (``/proc/self/maps``), then the versioned sonames (dlopen returns a library already loaded under its
    soname), the pip folders, and the system's CUDA.

    Args:
        site_dirs: Folders to search for pip's ``nvidia`` packages (default: this interpreter's).
        maps: The text of ``/proc/self/maps`` (default: read it).
    """
    found: list[str] = []
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcudart.so" in path and path not in found:
            found.append(path)
    found += ["libcudart.so.13", "libcudart.so.12"]
    if site_dirs is None:
        site_dirs = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    for folder in dict.fromkeys(site_dirs):
        for pattern in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu*/lib/libcudart.so*"):
            found += sorted(glob.glob(os.path.join(folder, pattern)), reverse=True)
    found += [ctypes.util.find_library("cudart") or "", "libcudart.so", "/usr/local/cuda/lib64/libcudart.so",
              "/usr/local/cuda/lib64/libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so.13"]
    return [name for name in dict.fromkeys(found) if name]


class CudaRuntime:
    """The few CUDA runtime calls a TensorRT runner needs, through ctypes."""

    def __init__(self) -> None:
        for name in cudart_candidates():
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise MissingDependencyError("the CUDA runtime (libcudart) is not loadable",
                                         fix="install CUDA (JetPack ships it under /usr/local/cuda/lib64) and add "
                                             "its lib folder to LD_LIBRARY_PATH, or pip install "
                                             "nvidia-cuda-runtime-cu12")

    def check(self, status: int, call: str) -> None:
        if status != 0:
            self.lib.cudaGetErrorString.restype = ctypes.c_char_p
            raise RunnerError(f"{call} failed: {self.lib.cudaGetErrorString(status).decode()}",
                              fix="see the CUDA error above; check the GPU with nvidia-smi or tegrastats")

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(nbytes)), "cudaMalloc")
        return int(pointer.value)

    def free(self, pointer: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(pointer))

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreate(ctypes.byref(handle)), "cudaStreamCreate")
        return int(handle.value or 0)

    def destroy_stream(self, stream: int) -> None:
        """``cudaStreamDestroy``: a loaded runner per batch and accelerator each holds one until it closes."""
        self.lib.cudaStreamDestroy(ctypes.c_void_p(stream))

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self.check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                                            kind, ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def synchronize(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory (``cudaHostAlloc``): copies from it are true DMA, as trtexec's buffers."""
        pointer = ctypes.c_void_p()
        self.check(self.lib.cudaHostAlloc(ctypes.byref(pointer), ctypes.c_size_t(nbytes), ctypes.c_uint(0)),
                   "cudaHostAlloc")
        return int(pointer.value)

    def free_host(self, pointer: int) -> None:
        self.lib.cudaFreeHost(ctypes.c_void_p(pointer))

    def event(self, blocking: bool = False) -> int:
        """``cudaEventCreateWithFlags``: ``blocking`` (cudaEventBlockingSync) makes a host waiting on it sleep, as
        trtexec's events do unless ``--useSpinWait`` (samples/common/sampleDevice.h), instead of spinning a core."""
        handle = ctypes.c_void_p()
        self.check(self.lib.cudaEventCreateWithFlags(ctypes.byref(handle), ctypes.c_uint(1 if blocking else 0)),
                   "cudaEventCreateWithFlags")
        return int(handle.value or 0)

    def wait_event(self, event: int) -> None:
        """``cudaEventSynchronize``: the host waits until the event completes (asleep for a blocking-sync event)."""
        self.check(self.lib.cudaEventSynchronize(ctypes.c_void_p(event)), "cudaEventSynchronize")

    def record(self, event: int, stream: int) -> None:
        self.check(self.lib.cudaEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream)), "cudaEventRecord")

    def elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two recorded, completed events (``cudaEventElapsedTime``)."""
        ms = ctypes.c_float()
        self.check(self.lib.cudaEventElapsedTime(ctypes.byref(ms), ctypes.c_void_p(start), ctypes.c_void_p(end)),
                   "cudaEventElapsedTime")
        return float(ms.value)

    def destroy_event(self, event: int) -> None:
        self.lib.cudaEventDestroy(ctypes.c_void_p(event))

    def pci_bus_id(self, device: int = 0) -> str | None:
        """CUDA device ``device``'s PCI bus id (``0000:01:00.0``), for matching it in NVML."""
        buffer = ctypes.create_string_buffer(32)
        try:
            status = self.lib.cudaDeviceGetPCIBusId(buffer, ctypes.c_int(len(buffer)), ctypes.c_int(device))
        except AttributeError:
            return None
        return buffer.value.decode() or None if status == 0 else None
