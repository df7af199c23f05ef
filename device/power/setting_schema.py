"""A sweep's setting as the device showed it (:class:`PowerSetting`) and a setting it did not measure
(:class:`NotMeasured`): shared by the timed windows (``RunResult.power_setting``) and the sustained runs
(``SustainedResult.power_setting``), re-exported by :mod:`device.schema`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from device.jobs.window import Measured

# A sweep's restore of the mode it found, at most (device.jobs.sweep's wait; NVML's takes less): a sustained sweep keeps it
# back from its last run.
SWEEP_RESTORE_S = 60.0


class PowerSetting(Measured):
    """The power setting a window ran under, as the device showed it once it had taken effect (2.2): a Jetson's
    nvpmodel mode, or a data-center GPU's NVML power limit or locked clocks (2.3)."""

    nvpmodel_id: int | None = None
    nvpmodel_name: str | None = None
    jetson_clocks: bool | None = Field(None, description="null: the board has no jetson_clocks (or is no Jetson)")
    online_cores: list[int] = Field(default_factory=list, description="indices of the CPU cores online")
    cpu_max_khz: dict[int, int] = Field(default_factory=dict, description="online core → its cpufreq "
                                                                          "scaling_max_freq cap, kHz")
    gpu_max_khz: int | None = Field(None, description="the GPU's devfreq max_freq cap, kHz")
    power_limit_w: float | None = Field(None, description="NVML's power management limit read back, W (2.3)")
    gpu_locked_mhz: int | None = Field(None, description="the graphics clock locked through NVML, MHz (2.3)")
    settle_s: float = Field(description="seconds from setting the setting until the device showed it")

    def label(self) -> str:
        """The setting's name in the front: the nvpmodel mode, ``250 W limit`` or ``1410 MHz locked``."""
        if self.nvpmodel_name is not None:
            return self.nvpmodel_name
        if self.power_limit_w is not None:
            return f"{self.power_limit_w:g} W limit"
        return f"{self.gpu_locked_mhz} MHz locked"


class NotMeasured(Measured):
    """A sweep setting that was not measured, and why."""

    nvpmodel_id: int | None
    nvpmodel_name: str
    jetson_clocks: bool | None
    kind: Literal["skipped", "refused"] = Field(description="skipped: never set (needs a reboot, no jetson_clocks, an "
                                                            "accelerator the device lacks); refused: set, but it never "
                                                            "took effect")
    reason: str
    accelerator: str | None = Field(None, description="the accelerator never measured (every setting of it); null: "
                                                      "the setting, on every accelerator (2.3)")
