"""The jtop sampler (Jetson): every power rail and the board's true total, RAM and NvMap, GPU load
and clock, temperatures, power mode and jetson_clocks, through the jtop service's client.

Power is jtop's instantaneous ``power`` of each rail, never its ``avg`` (a two-sample smoothing,
not a time average): the trace integrates it over the window. The board's total is the first
input rail present by board naming (VIN on Thor, POM_5V_IN on Nano, VDD_IN on Orin Nano/NX and
Xavier NX, VIN_SYS_5V0 on AGX Orin); jtop's own ``tot`` is a sum of rails where no such rail is
known, which double-counts (jetson_stats issues 344 and 51), so it is used only as a last resort.
"""

from __future__ import annotations

from typing import Any

from device.errors import MissingDependencyError, require
from device.telemetry.base import Sampler

TOTAL_RAILS = ("VIN", "POM_5V_IN", "VDD_IN", "VIN_SYS_5V0")


def board_total(power: dict[str, Any]) -> tuple[str, float]:
    """(name of the rail used, its power in mW) from jtop's ``power`` dictionary."""
    total = power.get("tot", {})
    if total.get("name") in TOTAL_RAILS:
        return total["name"], float(total["power"])
    rails = power.get("rail", {})
    for name in TOTAL_RAILS:
        if name in rails and rails[name].get("online", True):
            return name, float(rails[name]["power"])
    return "sum of rails (jtop tot)", float(total.get("power", float("nan")))


class JtopSampler(Sampler):
    """Samples a Jetson through the jtop service (``/run/jtop.sock``).

    Values: ``board_power_mw``, ``rail_<NAME>_mw`` per rail, ``ram_used_mb``, ``nvmap_mb``,
    ``gpu_load_percent``, ``gpu_freq_mhz``, ``temp_<zone>_c``. ``board_rail`` names the total's
    source; ``nvpmodel`` and ``jetson_clocks`` are read once when the sampler opens.
    """

    name = "jtop"

    def __init__(self, rate_hz: float = 10.0):
        super().__init__(rate_hz)
        self._jetson = None
        self.board_rail: str | None = None
        self.nvpmodel: str | None = None
        self.jetson_clocks: bool | None = None
        self.board: dict[str, Any] = {}

    def open(self) -> None:
        client = require("jtop", "jetson-stats", "pip install 'edgefold[jetson]'")
        jetson = client.jtop(interval=1.0 / self.rate_hz)
        try:
            jetson.start()
        except client.JtopException as err:
            raise MissingDependencyError(
                f"the jtop service is not reachable: {err}",
                fix="sudo systemctl restart jtop.service; in Docker mount -v /run/jtop.sock:/run/jtop.sock",
            ) from None
        self._jetson = jetson
        self.board = dict(jetson.board.get("hardware", {}))
        self.nvpmodel = str(jetson.nvpmodel) if jetson.nvpmodel is not None else None
        self.jetson_clocks = bool(jetson.jetson_clocks) if jetson.jetson_clocks is not None else None
        self.board_rail, _ = board_total(jetson.power)

    def read(self) -> dict[str, float]:
        jetson = self._jetson
        if jetson is None:
            raise RuntimeError("jtop sampler is not open")
        jetson.ok()  # raises EOFError/ConnectionResetError when the service dies: recorded by the base
        power = jetson.power
        self.board_rail, total = board_total(power)
        values = {"board_power_mw": total}
        for name, rail in power.get("rail", {}).items():
            values[f"rail_{name}_mw"] = float(rail["power"])
        ram = jetson.memory.get("RAM", {})
        values["ram_used_mb"] = ram.get("used", float("nan")) / 1024
        values["nvmap_mb"] = ram.get("shared", float("nan")) / 1024
        gpu = jetson.gpu.get("gpu", {})
        values["gpu_load_percent"] = float(gpu.get("status", {}).get("load", float("nan")))
        values["gpu_freq_mhz"] = float(gpu.get("freq", {}).get("cur", float("nan"))) / 1000
        for zone, reading in jetson.temperature.items():
            if reading.get("online", True) and reading.get("temp", -256) > -256:
                values[f"temp_{zone}_c"] = float(reading["temp"])
        return values

    def close(self) -> None:
        if self._jetson is not None:
            try:
                self._jetson.close()
            except Exception:  # closing a client whose service already died raises the same raw errors
                pass
            self._jetson = None
