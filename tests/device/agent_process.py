"""A real agent (``edgefold-agent serve`` under uvicorn) on loopback, in its own process, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TOKEN = "test-token-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AgentProcess:
    """Starts, kills and restarts one agent on a data dir.

    Args:
        data_dir: The agent's state (kept across restarts).
        env: Extra environment (e.g. ``EDGEFOLD_AGENT_FAULT``).
        args: Extra ``serve`` flags.
    """

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.data_dir.parent / f"{self.data_dir.name}.token"
        self.token_file.write_text(TOKEN + "\n")
        self.env, self.args = env or {}, args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> "AgentProcess":
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **self.env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "device.cli", "serve", "--port", str(self.port), "--data-dir", str(self.data_dir),
             "--token-file", str(self.token_file), *self.args],
            cwd=REPO, env=env, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        import httpx

        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"agent exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"agent did not answer:\n{self.log.read_text()}")
            time.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)

    def client(self, timeout_s: float = 30.0):
        from device.client import AgentClient

        return AgentClient(self.url, TOKEN, timeout_s=timeout_s)

    def __enter__(self) -> "AgentProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill(signal.SIGTERM)


def tiny_onnx(path: Path, channels: int = 3, size: int = 16, classes: int = 10, seed: int = 0) -> Path:
    """A small real ONNX classifier (Conv, Relu, global pool, Gemm) with a dynamic batch axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal((8, channels, 3, 3)).astype(np.float32) * 0.2, "w"),
               numpy_helper.from_array(np.zeros(8, np.float32), "b"),
               numpy_helper.from_array(rng.standard_normal((classes, 8)).astype(np.float32) * 0.2, "fc_w"),
               numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                            ["batch", channels, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
