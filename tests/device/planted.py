"""Planted power traces: drive a simulated Jetson's rails at known instants and know the exact energy.

The simulated board (:mod:`tests.device.jetson_sim`) runs the REAL jtop service. ``PlantedBoard``
changes one rail (the load rail) at instants it records on this process's monotonic clock, keeps
the board total that follows from the physics (the input rail where the board has one, else the
sum of every monitored rail, each computed as jtop computes it), and integrates that piecewise-
constant total exactly over any window. ``run_case`` drives one case through a ``JtopSampler`` and
compares the sampler's energy per image with the exact one.

Cases (``CASES``): a step, spikes, a short window, the service killed and the service stalled.
Used by ``tests/device/test_planted_power.py`` and ``bench/planted_power.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tests.device.jetson_sim import BOARDS, HWMON, HWMON_2, _replace, rail_power_mw, set_vin_power

# Which rail carries the planted load, per board: (monitor, channel) of an INA3221, or "vin" (Thor's INA238).
LOAD_RAIL = {"orin-nano": (1, 1), "agx-orin": (1, 1), "thor": "vin"}
# Rails that never count: jtop skips NC channels.
_SKIPPED = ("NC",)
INPUT_RAILS = ("VIN", "POM_5V_IN", "VDD_IN")


@dataclass
class PlantedBoard:
    """A simulated board whose total power is changed at recorded instants.

    Args:
        root: The simulated tree (``JtopService.root``).
        board: A profile of ``jetson_sim.BOARDS``.
    """

    root: Path
    board: str
    changes: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, board total mW from then)

    def __post_init__(self) -> None:
        spec = BOARDS[self.board]
        self.rails = {(1, ch): [label, mv, ma] for ch, (label, mv, ma) in enumerate(spec["rails"], start=1)}
        self.rails.update({(2, ch): [label, mv, ma] for ch, (label, mv, ma) in enumerate(spec.get("rails_2", []), start=1)})
        self.vin_uw = spec["vin"][0] * spec["vin"][1] if "vin" in spec else None
        self.changes = [(time.monotonic() - 3600.0, self.total_mw())]

    def total_mw(self) -> float:
        """The board total the physics gives: the input rail, else the sum of every monitored rail."""
        if self.vin_uw is not None:
            return float(self.vin_uw // 1000)  # jtop reads the INA238's µW as mW, truncated
        powers = {label: rail_power_mw(mv, ma) for label, mv, ma in self.rails.values() if label not in _SKIPPED}
        for name in INPUT_RAILS:
            if name in powers:
                return float(powers[name])
        return float(sum(powers.values()))

    def floor_mw(self) -> float:
        """The part of the total the load rail does not carry (the other summed rails on AGX Orin)."""
        load = LOAD_RAIL[self.board]
        if load == "vin" or self.rails[load][0] in INPUT_RAILS:
            return 0.0
        label, mv, ma = self.rails[load]
        return self.total_mw() - rail_power_mw(mv, ma)

    def set_total(self, total_mw: float) -> float:
        """Moves the load rail so that the board total becomes ``total_mw`` (as near as the units allow).

        Returns:
            The total actually planted.
        """
        load = LOAD_RAIL[self.board]
        if load == "vin":
            self.vin_uw = int(total_mw * 1000)
            before = time.monotonic()
            set_vin_power(self.root, self.vin_uw)
        else:
            label, mv, _ = self.rails[load]
            others = 0.0 if label in INPUT_RAILS else self.total_mw() - rail_power_mw(mv, self.rails[load][2])
            milliamps = int(round((total_mw - others) * 1000 / mv))
            self.rails[load][2] = milliamps
            monitor, channel = load
            before = time.monotonic()
            _replace(Path(self.root) / (HWMON if monitor == 1 else HWMON_2) / f"curr{channel}_input", milliamps)
        # The file is replaced atomically between these two instants: the change happens there.
        self.changes.append(((before + time.monotonic()) / 2, self.total_mw()))
        return self.total_mw()

    def exact_energy_mj(self, start: float, stop: float) -> float:
        """The exact integral of the planted total over [start, stop], in mJ."""
        energy = 0.0
        for (t0, power), (t1, _) in zip(self.changes, self.changes[1:] + [(float("inf"), 0.0)]):
            lo, hi = max(t0, start), min(t1, stop)
            if hi > lo:
                energy += power * (hi - lo)
        return energy


@dataclass
class Case:
    """One planted case.

    Attributes:
        name: Short name for tables.
        window_s: The window's length.
        plan: (offset from the window's start in s, load in mW) steps within the window; the board
            total is the load plus what the board's other summed rails draw (AGX Orin).
        fault: None, ``kill`` (the service is SIGKILLed at ``fault_at_s``) or ``stall`` (paused for
            ``stall_s`` from ``fault_at_s``).
        base_mw: The load standing before and at the window's start.
    """

    name: str
    window_s: float
    plan: list[tuple[float, float]]
    fault: str | None = None
    fault_at_s: float = 0.0
    stall_s: float = 0.0
    base_mw: float = 5000.0


CASES = {
    "step": Case("step", 2.0, [(0.93, 10000.0)]),
    "spikes": Case("spikes", 2.0, [(0.31, 15000.0), (0.44, 5000.0), (0.97, 15000.0), (1.09, 5000.0),
                                   (1.52, 15000.0), (1.66, 5000.0)]),
    "short": Case("short", 0.25, [(0.12, 10000.0)]),
    "killed": Case("killed", 2.0, [(0.5, 8000.0)], fault="kill", fault_at_s=1.3),
    "stalled": Case("stalled", 2.0, [(0.6, 9000.0), (1.1, 6000.0)], fault="stall", fault_at_s=0.8, stall_s=0.6),
}
# A steady stream of one-image calls, so "images in the covered time" is well defined.
CALL_S = 0.005


@dataclass
class Outcome:
    """What one case gave: the published energy per image against the exact one, and the flags."""

    case: str
    board: str
    exact_mj_per_image: float
    published_mj_per_image: float | None
    degraded: bool
    reasons: dict[str, str]
    coverage: float
    achieved_hz: float
    uncertainty_rel: float | None = None  # the sampling uncertainty the sampler states for its figure
    # The largest gap between the service's own sample stamps before any planted fault: a loaded host that starved
    # the service shows here, in the data, whatever the wall clock of the test did.
    largest_gap_s: float = 0.0
    stale_limit_s: float = float("inf")

    @property
    def starved(self) -> bool:
        """The service published nothing for longer than the sampler's staleness limit before any fault."""
        return self.largest_gap_s > self.stale_limit_s

    @property
    def error(self) -> float | None:
        """Relative error of the published figure (None when none was published)."""
        if self.published_mj_per_image is None:
            return None
        return self.published_mj_per_image / self.exact_mj_per_image - 1

    @property
    def acceptable(self) -> bool:
        """Within 2% of the exact energy, or flagged degraded."""
        return bool(self.degraded or (self.error is not None and abs(self.error) <= 0.02))


def run_case(svc, board: str, case: Case, rate_hz: float = 20.0,
             sampler_factory: Callable | None = None) -> Outcome:
    """Runs ``case`` on a started ``JtopService`` for ``board``; the service must be fresh for a fault case."""
    from device.telemetry.base import window_energy
    from device.telemetry.jtop import JtopSampler

    planted = PlantedBoard(svc.root, board)
    floor = planted.floor_mw()
    factory = sampler_factory or (lambda: JtopSampler(rate_hz=rate_hz))
    with factory() as sampler:
        planted.set_total(floor + case.base_mw)
        time.sleep(0.3)  # the base level is what the service reads before the window
        sampler.start()
        start = time.monotonic()
        events = sorted([(t, "set", mw) for t, mw in case.plan]
                        + ([(case.fault_at_s, case.fault, None)] if case.fault else [])
                        + ([(case.fault_at_s + case.stall_s, "resume", None)] if case.fault == "stall" else []))
        for offset, action, value in events:
            time.sleep(max(0.0, start + offset - time.monotonic()))
            if action == "set":
                planted.set_total(floor + value)
            elif action == "kill":
                svc.kill()
            elif action == "stall":
                svc.pause()
            elif action == "resume":
                svc.resume()
        time.sleep(max(0.0, start + case.window_s - time.monotonic()))
        stop = time.monotonic()
        trace = sampler.stop()
    calls = [(t, min(t + CALL_S, stop), 1) for t in np.arange(start, stop, CALL_S)]
    result = window_energy(trace, start, stop, calls, power_key="board_power_mw")
    exact = planted.exact_energy_mj(start, stop) / len(calls)
    until = start + (case.fault_at_s if case.fault else case.window_s)
    stamps = [t for t in trace.times_s if t <= until] + [until]
    gaps = np.diff(stamps) if len(stamps) > 1 else np.zeros(1)
    return Outcome(case.name, board, exact, result["energy_mj_per_image"], result["degraded"],
                   result["degraded_reasons"], result["coverage"], trace.achieved_hz,
                   result.get("energy_uncertainty_rel"), float(gaps.max()), sampler.stale_limit_s)
