"""The jtop sampler (Jetson): every power rail and the board's total, RAM and NvMap, GPU load and
clock, temperatures, power mode and jetson_clocks, through the jtop service's client.

The board's total is the board's input rail where one exists (VIN on Thor's carrier INA238,
POM_5V_IN on Nano, VDD_IN on Orin Nano/NX and Xavier NX), otherwise the sum of every monitored
rail: AGX Orin and AGX Xavier have no input rail, and their rails (VDD_GPU_SOC, VDD_CPU_CV,
VIN_SYS_5V0, VDDQ_VDD2_1V8AO on AGX Orin) together are the module's power, which is what jtop
7.2.2's ``total_power()`` computes (rbonghi/jetson_stats#344 was the opposite bug). A sub-rail such
as VIN_SYS_5V0 (the 5 V system/IO rail) is never the total.

Power is each rail's instantaneous ``power``, never jtop's ``avg`` (a two-sample smoothing). Each
measurement is taken from the client as the service publishes it (an observer on the client's
reader thread) and stamped with the service's own data time (``uptime``, read from /proc/uptime
when the service sampled), so values never lag their stamps; a measurement the client hands out
again (it does so every 3 intervals while the service stalls) is kept once, which makes a stall a
gap, and the freshest value's age is tracked against the stale limit. ``ok()`` is polled without
blocking: its blocking form stops the client's reader for good after one stall.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from typing import Any

from device.power import jtop_client
from device.telemetry import series
from device.telemetry.base import GAP_FACTOR, Sampler

# Input rails by board naming, in jtop 7.2.2's order of preference (jtop/core/power.py total_power).
INPUT_RAILS = ("VIN", "POM_5V_IN", "VDD_IN")
# A devfreq clock in kHz is above this; an NVML clock in MHz (JetPack 7 Thor) below it.
KHZ_THRESHOLD = 20_000
# /proc/uptime prints hundredths truncated: the measurement lies on average half a step later.
_UPTIME_HALF_STEP_S = 0.005
# The service's tick runs `nvpmodel -q` and rebuilds its process table (jtop/service.py at 7.2.2), so it may
# deliver slower than the interval it was configured with: the rate is measured from the values' own stamps
# over this many intervals once the client opens (bounded by DELIVERED_WAIT_S), and kept up to date after.
DELIVERED_TICKS = 5
DELIVERED_WAIT_S = 3.0


def board_total(power: dict[str, Any]) -> tuple[str, float]:
    """(what the total is, its power in mW) from jtop's ``power`` dictionary.

    The input rail where one exists; otherwise the sum of every monitored rail that is online.
    Power-supply entries (batteries, USB-C: they carry a ``status``) are not board rails and are
    left out of the sum.
    """
    total = power.get("tot", {})
    if total.get("name") in INPUT_RAILS:
        return total["name"], float(total["power"])
    rails = power.get("rail", {})
    for name in INPUT_RAILS:
        if name in rails and rails[name].get("online", True):
            return name, float(rails[name]["power"])
    summed = summed_rails(power)
    if summed:
        return f"sum of {len(summed)} rails", float(sum(float(rails[name]["power"]) for name in summed))
    if "power" in total:
        return "jtop tot", float(total["power"])
    return "none", float("nan")


def summed_rails(power: dict[str, Any]) -> list[str]:
    """The rails whose sum is the board total on a board without an input rail."""
    rails = power.get("rail", {})
    return sorted(name for name, rail in rails.items()
                  if rail.get("online", True) and "status" not in rail and "power" in rail)


def gpu_entry(gpu: Any) -> tuple[str | None, dict[str, Any]]:
    """jtop's entry for the integrated GPU, by what jtop reports (``gpu``, ``gv11b``, ``ga10b``, ``Thor``…)."""
    try:
        items = list(gpu.items())
    except AttributeError:
        return None, {}
    for name, entry in items:
        if isinstance(entry, dict) and entry.get("type") == "integrated":
            return name, entry
    return items[0] if items else (None, {})


def gpu_khz(value: Any) -> int | None:
    """A clock jtop gives for the GPU, in kHz whatever unit it came in: the sysfs devfreq path gives kHz, Thor's NVML
    path MHz (jetson-stats 7.2.2 jtop/core/gpu.py nvml_read_gpu_status), and its gpu-gpc-0 fallback ``max_freq //
    1000`` kHz from a devfreq node in Hz. A clock in MHz is below :data:`KHZ_THRESHOLD`, one in kHz far above it."""
    if not isinstance(value, (int, float)) or value <= 0:
        return None
    return int(value) if value > KHZ_THRESHOLD else int(round(value * 1000))


def _gpu_freqs(jetson) -> list[dict[str, Any]]:
    return [entry["freq"] for entry in (jetson.gpu or {}).values()
            if isinstance(entry, dict) and isinstance(entry.get("freq"), dict)]


def gpu_units_differ(jetson) -> bool:
    """Whether jtop gives the GPU's maximum and minimum clocks in different units.

    On Thor jetson-stats 7.2.2 takes the maximum from NVML in MHz and the minimum from the gpu-gpc-0 devfreq node
    in kHz (jtop/core/gpu.py, nvml_read_gpu_status and _thor_gpc_freq), and its jetson_clocks_alive compares the
    two as they are (jtop/core/jetson_clocks.py): jtop never reports jetson_clocks on there.
    """
    for freq in _gpu_freqs(jetson):
        high, low = freq.get("max"), freq.get("min")
        if isinstance(high, (int, float)) and isinstance(low, (int, float)) and high > 0 and low > 0 and \
                (high > KHZ_THRESHOLD) != (low > KHZ_THRESHOLD):
            return True
    return False


def jetson_clocks_on(jetson) -> bool | None:
    """jtop's jetson_clocks state (None: the board has none), read in one unit where jtop's own cannot be on.

    There jtop's jetson_clocks_alive rule applies with the GPU's clocks in kHz: every online core's and the GPU's
    minimum at their maximum (NVML's whole MHz meet a kHz devfreq within 2 %), EMC at its maximum.
    """
    clocks = jetson.jetson_clocks
    if clocks is None or bool(clocks) or not gpu_units_differ(jetson):
        return None if clocks is None else bool(clocks)
    for cpu in jetson.cpu.get("cpu", []):
        freq = cpu.get("freq") if cpu.get("online", True) else None
        if isinstance(freq, dict) and freq.get("max") != freq.get("min"):
            return False
    for freq in _gpu_freqs(jetson):
        high, low = gpu_khz(freq.get("max")), gpu_khz(freq.get("min"))
        if high is None or low is None or abs(high - low) > 0.02 * high:
            return False
    emc = (jetson.memory or {}).get("EMC", {})
    return "max" not in emc or emc.get("max") == emc.get("cur")


def gpu_freq_mhz(entry: dict[str, Any]) -> float:
    """The GPU's current clock in MHz (:func:`gpu_khz`)."""
    khz = gpu_khz((entry.get("freq") or {}).get("cur"))
    return float("nan") if khz is None else khz / 1000


def _boottime() -> float:
    # /proc/uptime is CLOCK_BOOTTIME; fall back to the monotonic clock where there is no BOOTTIME.
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def clock_offset(monotonic=time.monotonic, boottime=None) -> float:
    """CLOCK_BOOTTIME minus CLOCK_MONOTONIC (constant between suspends), from the tightest of three
    monotonic-boottime-monotonic brackets: a preemption between two reads (a loaded board descheduling the
    sampler's thread) would otherwise enter the offset, and then every sample's time."""
    boottime = boottime or _boottime
    best_width, best_offset = math.inf, 0.0
    for _ in range(3):
        before = monotonic()
        boot = boottime()
        after = monotonic()
        if after - before < best_width:
            best_width, best_offset = after - before, boot - (before + after) / 2
    return best_offset


def shared_client(samplers) -> Any:
    """The open jtop sampler's client, for a sweep to set modes through (None: no jtop sampler is open)."""
    return next((s.client for s in samplers if s.name == "jtop" and getattr(s, "client", None) is not None), None)


class JtopSampler(Sampler):
    """Samples a Jetson through the jtop service (``/run/jtop.sock``).

    Values: ``board_power_mw``, ``rail_<NAME>_mw`` per rail, ``ram_used_mb``, ``nvmap_mb``,
    ``gpu_load_percent``, ``gpu_freq_mhz``, ``temp_<zone>_c``. ``board_rail`` names the total's
    source (``summed_rails`` the rails of a sum); ``nvpmodel``, ``jetson_clocks``, ``gpu_name``,
    ``service_interval_s`` (the interval the service was configured with, by its first client: not what it
    delivers) and ``delivered_interval_s`` (the median time between the values it delivered, from their own
    stamps) are read when the sampler opens, with ``service_version`` and ``client_version`` (jetson-stats on
    either side). Gaps are judged against the slowest of the three intervals (asked, configured, delivered): a
    service that delivers every 200 ms leaves no gap in a window where it delivered every 200 ms.
    """

    name = "jtop"
    needs_post_sample = True
    # /proc/uptime's 10 ms steps, and the service reads the rails a few ms after it reads the uptime
    # (12 ms on average in the simulation, where it also walks the host's /proc).
    stamp_uncertainty_s = 0.015

    def __init__(self, rate_hz: float = 10.0):
        super().__init__(rate_hz)
        self._jetson = None
        self._lock = threading.Lock()
        self._ticks: list[tuple[float, dict[str, float]]] = []
        self._last_tick: tuple[float, dict[str, float]] | None = None
        self._recording = False
        self._tick_error: str | None = None
        self._clock_offset: float | None = None
        self.board_rail: str | None = None
        self.summed_rails: list[str] = []
        self.nvpmodel: str | None = None
        self.jetson_clocks: bool | None = None
        self.board: dict[str, Any] = {}
        self.gpu_name: str | None = None
        self.service_interval_s: float | None = None
        self.delivered_interval_s: float | None = None
        self._stamps: collections.deque[float] = collections.deque(maxlen=64)
        self.data_time: str = "jtop uptime"
        self.service_version: str | None = None
        self.client_version: str | None = None

    @property
    def gap_limit_s(self) -> float:
        # The service may run slower than asked (its first client owns the rate): judge gaps by its interval.
        interval = max(self.service_interval_s or 0.0, 1.0 / self.rate_hz, self.delivered() or 0.0)
        return GAP_FACTOR * interval

    @property
    def client(self):
        """The open jtop client (None while closed): a sweep sets power modes through it rather than a second one."""
        return self._jetson

    def delivered(self) -> float | None:
        """The median time between the last values the service delivered (None before three of them)."""
        with self._lock:
            stamps = list(self._stamps)
        steps = [later - earlier for earlier, later in zip(stamps, stamps[1:]) if later > earlier]
        return statistics.median(steps) if len(steps) >= 2 else None

    def open(self) -> None:
        # A service of another release raises JtopVersionError, which no telemetry: auto may drop.
        jetson = jtop_client.start(1.0 / self.rate_hz, observer=self._on_tick)
        self._jetson = jetson
        self.service_version = jetson.service_version
        self.client_version = jtop_client.client_version()
        self.board = dict(jetson.board.get("hardware", {}))
        self.nvpmodel = str(jetson.nvpmodel) if jetson.nvpmodel is not None else None
        self.jetson_clocks = jetson_clocks_on(jetson)
        self.board_rail, _ = board_total(jetson.power)
        self.summed_rails = summed_rails(jetson.power) if self.board_rail.startswith("sum of") else []
        self.gpu_name, _ = gpu_entry(jetson.gpu)
        try:
            self.service_interval_s = float(jetson.interval)
        except (TypeError, ValueError, AttributeError):
            self.service_interval_s = None
        deadline = time.monotonic() + DELIVERED_WAIT_S
        while len(self._stamps) < DELIVERED_TICKS and time.monotonic() < deadline:
            time.sleep(0.01)
        self.delivered_interval_s = self.delivered()

    def _stamp(self, uptime_s: float | None) -> float:
        """The monotonic time a measurement with the service's data time ``uptime_s`` was taken."""
        now = time.monotonic()
        if uptime_s is None:
            self.data_time = "arrival (jtop sent no uptime)"
            return now
        if self._clock_offset is None:
            offset = clock_offset()
            age = _boottime() - uptime_s
            # A service in another time namespace would give ages that make no sense: stamp on arrival.
            self._clock_offset = offset if -0.05 < age < 60 else math.nan
            if math.isnan(self._clock_offset):
                self.data_time = f"arrival (jtop's uptime is {age:.1f} s off this clock)"
        if math.isnan(self._clock_offset):
            return now
        return uptime_s + _UPTIME_HALF_STEP_S - self._clock_offset

    def _on_tick(self, jetson) -> None:
        # Runs on the client's reader thread for every measurement it receives: never raise here,
        # an exception would end the reader.
        try:
            try:
                uptime = jetson.uptime.total_seconds()
            except (KeyError, AttributeError, TypeError):
                uptime = None
            stamp = self._stamp(uptime)
            tick = (stamp, self._values(jetson))
        except Exception as err:
            self._tick_error = f"{type(err).__name__}: {err}"
            return
        with self._lock:
            if not self._stamps or stamp != self._stamps[-1]:
                self._stamps.append(stamp)
            self._last_tick = tick
            if self._recording:
                self._ticks.append(tick)

    def _values(self, jetson) -> dict[str, float]:
        power = jetson.power
        self.board_rail, total = board_total(power)
        values = {series.BOARD_POWER: total}
        for name, rail in power.get("rail", {}).items():
            values[series.rail(name)] = float(rail["power"])
        ram = jetson.memory.get("RAM", {})
        values[series.RAM_USED] = ram.get("used", float("nan")) / 1024
        values[series.NVMAP] = ram.get("shared", float("nan")) / 1024
        _, gpu = gpu_entry(jetson.gpu)
        values[series.GPU_LOAD] = float((gpu.get("status") or {}).get("load", float("nan")))
        values[series.GPU_FREQ] = gpu_freq_mhz(gpu)
        for zone, reading in jetson.temperature.items():
            if reading.get("online", True) and reading.get("temp", -256) > -256:
                values[series.temperature(zone)] = float(reading["temp"])
        return values

    def _check(self) -> None:
        """Raises the client's stored error (a dead service); flags a client that has stopped."""
        if not self._jetson.ok(spin=True):
            self.flag("jtop_not_ok", "jtop's ok() returned False: the client stopped reading the service "
                                     "(it missed 3 intervals); later values are frozen")
        if self._tick_error:
            self.flag("read_failed", f"a jtop measurement could not be read: {self._tick_error}")

    def read(self) -> dict[str, float]:
        """The newest measurement's values."""
        if self._jetson is None:
            raise RuntimeError("jtop sampler is not open")
        self._check()
        with self._lock:
            tick = self._last_tick
        return dict(tick[1]) if tick else self._values(self._jetson)

    def latest_stamp(self) -> float | None:
        with self._lock:
            return self._last_tick[0] if self._last_tick else None

    def sample_now(self) -> list[tuple[float, dict[str, float]]]:
        if self._jetson is None:
            raise RuntimeError("jtop sampler is not open")
        with self._lock:
            if not self._recording:  # the window opens: start from the measurement standing now
                self._recording = True
                self._ticks = [self._last_tick] if self._last_tick else []
                self._tick_error = None
            ticks, self._ticks = self._ticks, []
        try:
            self._check()
        except Exception as err:  # the service died: keep what it delivered before, record the loss
            self.record_error(err)
        return ticks

    def stop(self):
        trace = super().stop()
        with self._lock:
            self._recording = False
            self._ticks = []
        return trace

    def close(self) -> None:
        if self._jetson is not None:
            try:
                self._jetson.close()
            except Exception:  # closing a client whose service already died raises the same raw errors
                pass
            self._jetson = None
