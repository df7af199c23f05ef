"""What a GPU server's sweep records before it changes anything and restores after: the GPU's power limit (its
clocks are restored unlocked). Plain data, so the hold file's reader (:mod:`device.power.power_modes`) knows both kinds of
hold without importing NVML's control (:mod:`device.power.gpu_power`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPU_HOLD_SCHEMA = "edgefold.gpu-power-hold/1"


@dataclass(frozen=True)
class GpuState:
    """What a sweep found on the GPU and restores: its power limit (clocks are restored unlocked)."""

    pci_bus_id: str
    uuid: str
    power_limit_mw: int

    def to_dict(self) -> dict[str, Any]:
        return {"pci_bus_id": self.pci_bus_id, "uuid": self.uuid, "power_limit_mw": self.power_limit_mw}

    def describe(self) -> str:
        return f"power limit {self.power_limit_mw / 1000:g} W, clocks unlocked on GPU {self.uuid} ({self.pci_bus_id})"

    def by_hand(self) -> str:
        """The commands that restore it without EdgeFold."""
        return (f"sudo nvidia-smi -i {self.pci_bus_id} -pl {self.power_limit_mw / 1000:g}; "
                f"sudo nvidia-smi -i {self.pci_bus_id} -rgc")


def gpu_hold_state(data: dict[str, Any]) -> GpuState:
    """The state a GPU hold's JSON records (:func:`device.power.power_modes.read_hold` reads the file)."""
    return GpuState(str(data["pci_bus_id"]), str(data["uuid"]), int(data["power_limit_mw"]))
