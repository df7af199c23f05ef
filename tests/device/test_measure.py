"""The measurement protocol with a real ONNX Runtime runner and samplers on their threads."""

import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from device.errors import ConfigError
from device.jobs.measure import MeasureSpec, latency_stats, measure
from device.runners.onnxruntime import OnnxRuntimeRunner
from device.telemetry import Sampler
from device.telemetry.host import HostSampler


def tiny_onnx(path):
    weight = numpy_helper.from_array(np.ones((8, 3, 3, 3), dtype=np.float32) * 0.1, "w")
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Flatten", ["p"], ["logits"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


class BoardPower(Sampler):
    """A planted power rail (no Jetson here): 5 W idle, 8 W from the moment the runner first does timed work.

    It publishes a measurement for every millisecond since its last read, each stamped with its own time and valued
    by that time (as a source with its own clock does, jtop's service): what the window integrates is then the
    planted truth, however late the sampler's thread is scheduled on a loaded host.
    """

    name = "jtop"  # a stand-in for jtop's board power
    needs_post_sample = True
    step_s = 0.001

    def __init__(self, busy: threading.Event):
        super().__init__(rate_hz=100)
        self.busy, self.busy_since, self.published = busy, None, None

    def level(self, t: float) -> float:
        return 8000.0 if self.busy_since is not None and t >= self.busy_since else 5000.0

    def read(self):
        return {"board_power_mw": self.level(time.monotonic()), "gpu_freq_mhz": 1000.0, "temp_gpu_c": 50.0}

    def sample_now(self):
        now = time.monotonic()
        first = now if self.published is None else self.published + self.step_s
        stamps = np.arange(first, now + 1e-9, self.step_s) if first <= now else []
        if len(stamps):
            self.published = float(stamps[-1])
        return [(float(t), {"board_power_mw": self.level(t), "gpu_freq_mhz": 1000.0, "temp_gpu_c": 50.0})
                for t in stamps]


class BusyRunner:
    """Marks the rail busy from the first timed call on, and remembers when the timed calls began and ended."""

    def __init__(self, runner, busy, spec, rail=None):
        self.runner, self.busy, self.calls, self.warmup, self.rail = runner, busy, 0, spec.warmup_iterations, rail
        self.timed_calls, self.last_end = spec.iterations, None

    def infer(self, batch):
        self.calls += 1
        if self.calls > self.warmup and not self.busy.is_set():
            if self.rail is not None:
                self.rail.busy_since = time.monotonic()
            self.busy.set()
        time.sleep(0.002)  # long enough for the 100 Hz rail to see the work
        out = self.runner.infer(batch)
        if self.calls == self.warmup + self.timed_calls:  # the window's last call (the protocol calls on past it)
            self.last_end = time.monotonic()
        return out


def test_latency_stats_by_hand():
    stats = latency_stats([0.001, 0.002, 0.003, 0.004])
    assert stats["latency_p50_ms"] == pytest.approx(2.5) and stats["latency_mean_ms"] == pytest.approx(2.5)
    assert stats["latency_cv"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2.5)


def test_protocol_fences_telemetry_to_the_window(tmp_path):
    """Energy against the planted rail: 8 W from the first timed call to the window's end, 5 W before. Its bounds
    come from when the timed calls really ran (the last one's end), not from how a sampler thread was scheduled, so
    they hold on a loaded host."""
    busy = threading.Event()
    spec = MeasureSpec(warmup_iterations=3, iterations=60, idle_s=0.2)
    batch = np.zeros((4, 3, 16, 16), dtype=np.float32)
    with OnnxRuntimeRunner(tiny_onnx(tmp_path / "tiny.onnx"), threads=1) as ort, BoardPower(busy) as board, \
            HostSampler(rate_hz=50) as host:
        runner = BusyRunner(ort, busy, spec, rail=board)
        result = measure(runner, batch, spec, [board, host], power_key="board_power_mw").model_dump()
    assert result["iterations"] == 60 and result["images"] == 240
    assert result["latency_p50_ms"] >= 2.0 and result["throughput_images_per_s"] > 0
    tele = result["telemetry"]["jtop"]
    power = tele["series"]["board_power_mw"]
    assert power["idle"] == pytest.approx(5000) and power["peak"] == 8000
    window_s, images = result["window_s"], result["images"]
    busy_at_least_s = runner.last_end - board.busy_since  # 8 W over at least this much of the window
    assert 0 < busy_at_least_s <= window_s * 1.01
    # The window's first sample precedes the first call (the fence), so the mean sits under 8 W.
    assert 5000 + 3000 * busy_at_least_s / window_s - 50 < power["mean"] <= 8000
    low, high = 5000 * window_s + 3000 * busy_at_least_s, 8000 * window_s  # mJ over the window
    assert 0.99 * low / images <= tele["energy_mj_per_image"] <= 1.01 * high / images
    assert 0.98 * 3000 * busy_at_least_s / images <= tele["energy_above_idle_mj_per_image"] \
        <= 1.02 * 3000 * window_s / images
    assert not tele["degraded"], tele["degraded_reasons"]
    assert not tele["clocks_dropped"] and not tele["temp_limit_crossed"] and tele["errors"] == []
    assert result["telemetry"]["host"]["series"]["rss_mb"]["peak"] > 0


def test_duration_mode_and_bad_specs(tmp_path):
    with OnnxRuntimeRunner(tiny_onnx(tmp_path / "tiny.onnx"), threads=1) as ort:
        result = measure(ort, np.zeros((1, 3, 16, 16), dtype=np.float32),
                         MeasureSpec(warmup_iterations=1, iterations=None, duration_s=0.2, idle_s=0)).model_dump()
    assert result["window_s"] >= 0.2 and result["iterations"] >= 2 and result["telemetry"] == {}
    for kw, message in ((dict(iterations=None), "exactly one"), (dict(iterations=1), "≥ 2"),
                        (dict(iterations=None, duration_s=-1.0), "positive"), (dict(idle_s=-1), "not be negative")):
        with pytest.raises(ConfigError, match=message):
            MeasureSpec(**kw)


class PublishingRail(Sampler):
    """A source that publishes its measurements 30 ms late (as jtop's service does): 5 W idle, 8 W busy."""

    name = "jtop"  # a stand-in for jtop's board power
    needs_post_sample = True

    def __init__(self, busy: threading.Event):
        super().__init__(rate_hz=50)
        self.busy, self.history = busy, []

    def read(self):
        return {"board_power_mw": 8000.0 if self.busy.is_set() else 5000.0}

    def sample_now(self):
        now = time.monotonic()
        self.history.append((now, self.read()))
        return [(t, v) for t, v in self.history if t <= now - 0.03][-1:]


def test_the_device_stays_busy_until_a_measurement_after_the_window_arrives():
    """The window's end is interpolated towards a busy measurement, not towards idle: the old
    protocol stopped the work and let the last sample carry idle power into the window."""
    busy = threading.Event()

    class Runner:
        calls = 0

        def infer(self, batch):
            Runner.calls += 1
            busy.set()
            time.sleep(0.005)

    rail = PublishingRail(busy)
    result = measure(Runner(), np.zeros((1, 1), dtype=np.float32),
                     MeasureSpec(warmup_iterations=20, iterations=40, idle_s=0), [rail],
                     power_key="board_power_mw").model_dump()
    assert result["iterations"] == 40 and Runner.calls > 60, "untimed calls kept the device busy after the window"
    tele = result["telemetry"]["jtop"]
    assert tele["series"]["board_power_mw"]["mean"] == pytest.approx(8000) and tele["coverage"] == pytest.approx(1.0)
    assert tele["energy_mj_per_image"] == pytest.approx(8000 * result["window_s"] / 40, rel=0.02)
