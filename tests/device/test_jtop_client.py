"""The jtop sampler against a stand-in jtop client, for what the simulated service cannot be made to
do on cue: ``ok()`` returning False, measurements with chosen data times, the GPU entries of other
JetPacks (``ga10b`` in kHz, NVML-backed ``Thor`` in MHz). The stand-in follows jetson-stats 7.2.2's
client API: ``attach``/``start``, ``uptime`` (a timedelta), ``power``/``gpu``/``memory``/``temperature``."""

import sys
import time
import types
from datetime import timedelta

import pytest

from device.telemetry.jtop import JtopSampler, _boottime, clock_offset, gpu_entry, gpu_freq_mhz

GPU_ORIN_JP5 = {"ga10b": {"type": "integrated", "status": {"load": 40.0}, "freq": {"cur": 918000}}}
GPU_THOR = {"Thor": {"type": "integrated", "status": {"load": 12.0}, "freq": {"governor": "nvml", "cur": 1575}}}


class FakeJtop:
    """A client whose measurements the test publishes with :meth:`publish`."""

    instances: list["FakeJtop"] = []

    def __init__(self, interval=1.0):
        self.interval, self.observers, self.running, self.error = interval, [], True, None
        self.board = {"hardware": {"Model": "fake", "L4T": "36.4.7", "Jetpack": "6.2.1"}}
        self.nvpmodel, self.jetson_clocks = "MAXN", False
        self.gpu, self.memory, self.temperature = GPU_ORIN_JP5, {"RAM": {"used": 2048, "shared": 1024}}, {}
        self.power, self._uptime = {"rail": {}, "tot": {"name": "VDD_IN", "power": 5000}}, _boottime() - 1.0
        FakeJtop.instances.append(self)

    @property
    def uptime(self):
        return timedelta(seconds=self._uptime)

    def attach(self, observer):
        self.observers.append(observer)

    def start(self):
        self.publish(5000, self._uptime)

    def publish(self, milliwatts, uptime):
        self.power = {"rail": {}, "tot": {"name": "VDD_IN", "power": milliwatts}}
        self._uptime = uptime
        for observer in self.observers:
            observer(self)

    def ok(self, spin=False):
        if self.error:
            raise self.error
        return self.running

    def close(self):
        self.running = False


@pytest.fixture
def fake_jtop(monkeypatch):
    module = types.ModuleType("jtop")
    module.jtop = FakeJtop
    module.JtopException = type("JtopException", (Exception,), {})
    monkeypatch.setitem(sys.modules, "jtop", module)
    FakeJtop.instances.clear()
    return FakeJtop


def test_measurements_carry_the_services_data_time_not_the_samplers(fake_jtop):
    with JtopSampler(rate_hz=20) as sampler:
        client = fake_jtop.instances[0]
        sampler.start()
        measured = _boottime() - 0.3  # a measurement the service took 0.3 s ago, delivered only now
        client.publish(7000, measured)
        client.publish(7000, measured)  # handed out again (the client re-delivers while a service stalls)
        trace = sampler.stop()
    offset = clock_offset()
    stamps = trace.times_s[trace.values["board_power_mw"] == 7000]
    assert len(stamps) == 1, "a repeated measurement is one sample"
    assert stamps[0] == pytest.approx(measured - offset + 0.005, abs=0.002)
    assert "stale" in trace.flags  # nothing fresher than 0.3 s while the window ran


def test_ok_returning_false_is_a_named_flag(fake_jtop):
    with JtopSampler(rate_hz=50) as sampler:
        client = fake_jtop.instances[0]
        sampler.start()
        client.running = False  # jtop stops its reader for good after missing 3 intervals
        time.sleep(0.1)
        trace = sampler.stop()
    assert "jtop_not_ok" in trace.flags and "frozen" in trace.flags["jtop_not_ok"]


def test_a_dead_client_is_service_lost_and_keeps_earlier_measurements(fake_jtop):
    with JtopSampler(rate_hz=50) as sampler:
        client = fake_jtop.instances[0]
        sampler.start()
        client.publish(6000, _boottime())
        client.error = EOFError()
        time.sleep(0.1)
        trace = sampler.stop()
    assert "service_lost" in trace.flags and trace.errors[0].startswith("EOFError")
    assert 6000 in trace.values["board_power_mw"]


def test_gpu_entry_is_found_by_what_jtop_reports():
    assert gpu_entry(GPU_ORIN_JP5)[0] == "ga10b" and gpu_freq_mhz(GPU_ORIN_JP5["ga10b"]) == 918.0
    assert gpu_entry(GPU_THOR)[0] == "Thor" and gpu_freq_mhz(GPU_THOR["Thor"]) == 1575.0  # NVML: already MHz
    xavier = {"gv11b": {"type": "integrated", "status": {"load": 5.0}, "freq": {"cur": 1377000}}}
    assert gpu_entry(xavier)[0] == "gv11b" and gpu_freq_mhz(xavier["gv11b"]) == 1377.0
    assert gpu_entry({}) == (None, {})


def test_sampler_reads_the_gpu_under_its_own_name(fake_jtop):
    with JtopSampler(rate_hz=20) as sampler:
        values = sampler.read()
    assert sampler.gpu_name == "ga10b"
    assert values["gpu_load_percent"] == 40.0 and values["gpu_freq_mhz"] == 918.0


def test_the_clock_offset_comes_from_the_tightest_bracket():
    """A preemption between the monotonic and boottime reads (here 40 ms on the first try) stays out of the offset."""
    monotonic = iter([10.000, 10.040, 11.000, 11.0001, 12.000, 12.002])  # before/after per try
    boottime = iter([110.039, 111.00005, 112.0015])  # the true offset is 100.0
    assert clock_offset(lambda: next(monotonic), lambda: next(boottime)) == pytest.approx(100.0, abs=1e-6)
