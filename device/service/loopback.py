"""An agent on this machine's loopback interface, started and stopped by the caller.

The pipeline's deploy stage uses it when no device is configured, so ``make edge`` is complete on
one machine; the tests and benchmarks use it to drive a real agent over HTTP.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from device.errors import EdgeFoldError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LoopbackAgent:
    """``edgefold-agent serve`` in a child process on 127.0.0.1; its state survives restarts.

    Args:
        data_dir: The agent's data dir (the token file and log sit beside it).
        env: Extra environment for the agent.
        args: Extra ``serve`` flags.
        token: The bearer token (random by default).
    """

    def __init__(self, data_dir: str | os.PathLike, env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 token: str | None = None):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.token = token or secrets.token_urlsafe(24)
        self.token_file = self.data_dir.parent / f"{self.data_dir.name}.token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        self.env, self.args = env or {}, args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> "LoopbackAgent":
        """Starts the agent and waits for its health endpoint."""
        import httpx

        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "device.cli", "serve", "--port", str(self.port), "--data-dir", str(self.data_dir),
             "--token-file", str(self.token_file), *self.args],
            env=env, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise EdgeFoldError(f"the loopback agent exited with status {self.process.returncode}",
                                    fix=f"see its log: {self.log}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise EdgeFoldError(f"the loopback agent did not answer within {timeout_s:g} s",
                                    fix=f"see its log: {self.log}")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Sends ``sig`` (SIGTERM: graceful; SIGKILL: a crash) and waits for the exit."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self, timeout_s: float = 30.0):
        from device.client import AgentClient

        return AgentClient(self.url, self.token, timeout_s=timeout_s)

    def __enter__(self) -> "LoopbackAgent":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
