"""A real agent (``edgefold-agent serve`` under uvicorn) on loopback for tests, and a small real ONNX model."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np

from device.service.loopback import LoopbackAgent

TOKEN = "test-token-0123456789abcdef"


class AgentProcess(LoopbackAgent):
    """A loopback agent with the tests' fixed token; ``kill(sig)`` defaults to SIGKILL (a crash)."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        super().__init__(data_dir, env=env, args=args, token=TOKEN)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)


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


def keep_launched(monkeypatch) -> list:
    """Every job process the agent's launcher starts in this test, in order (forked or fresh)."""
    from device.service.launcher import Launcher

    children, launch = [], Launcher.launch

    def launch_and_keep(self, *args, **kwargs):
        children.append(launch(self, *args, **kwargs))
        return children[-1]

    monkeypatch.setattr(Launcher, "launch", launch_and_keep)
    return children


def plant(store, path: Path, kind: str) -> str:
    """Puts ``path`` into the store as an artifact of ``kind`` by hand, past the upload check (what a file put there by
    other means looks like to a job); returns its sha256."""
    import hashlib

    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    copy = store.temp_file()
    copy.write_bytes(path.read_bytes())
    store.add_artifact(sha, kind, copy)
    return sha


def store_model(store, path: Path) -> str:
    """Stores a tiny real ONNX model (written at ``path``) as an uploaded artifact; returns its sha256."""
    import hashlib

    model = tiny_onnx(path)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    copy = store.temp_file()
    copy.write_bytes(model.read_bytes())
    store.add_artifact(sha, "onnx", copy)
    return sha
