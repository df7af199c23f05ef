"""A simulated Jetson for running the REAL jtop service (jetson-stats) on an x86 build host.

``plant(root, board)`` writes the sysfs/procfs files jtop reads for a board profile;
``set_current(root, channel, ma)`` changes a rail while the service runs; ``JtopService`` starts
``python -m tests.device.jetson_sim ROOT SOCK`` in its own session, where jtop's hard-coded
absolute paths are redirected into ``root`` (only inside jtop's own modules) and its socket,
config folder and group are moved to temporary places. Nothing of jtop itself is replaced.
"""

from __future__ import annotations

import builtins
import grp
import os
import posixpath
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

REDIRECTED = ("/sys/", "/proc/meminfo", "/proc/stat", "/proc/device-tree/", "/etc/nv_tegra_release")
INA = "sys/bus/i2c/devices/1-0040"
HWMON = INA + "/hwmon/hwmon1"
# A second INA3221 (AGX Orin's carrier monitor) and Thor's carrier INA238.
INA_2 = "sys/bus/i2c/devices/1-0041"
HWMON_2 = INA_2 + "/hwmon/hwmon4"
INA238 = "sys/bus/i2c/devices/2-0044"
HWMON_238 = INA238 + "/hwmon/hwmon3"

BOARDS = {
    # Orin Nano: the board's input rail VDD_IN is jtop's total.
    "orin-nano": {
        "model": "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        "compatible": "nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234",
        "boardids": "3767:0005",
        "rails": [("VDD_IN", 5080, 1200), ("VDD_CPU_GPU_CV", 5080, 400), ("VDD_SOC", 5080, 300)],
    },
    # AGX Orin: no input rail. The first INA3221 (1-0040) monitors VDD_GPU_SOC, VDD_CPU_CV and
    # VIN_SYS_5V0 (the 5 V system/IO rail), the second (1-0041) VDDQ_VDD2_1V8AO (DDR) on channel 2,
    # with its other channels NC. The board total is the sum of all four.
    "agx-orin": {
        "model": "Jetson AGX Orin Developer Kit",
        "compatible": "nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234",
        "boardids": "3701:0005",
        "rails": [("VDD_GPU_SOC", 5000, 600), ("VDD_CPU_CV", 5000, 400), ("VIN_SYS_5V0", 5000, 1000)],
        "rails_2": [("NC", 5000, 0), ("VDDQ_VDD2_1V8AO", 5000, 200), ("NC", 5000, 0)],
    },
    # Thor: module rails (VDD_GPU, VDD_CPU_SOC_MSS, VIN_SYS_5V0) on an INA3221, the carrier board's
    # system input on an INA238, which jtop names VIN (power in microwatts) and takes as the total.
    "thor": {
        "model": "NVIDIA Jetson AGX Thor Developer Kit",
        "compatible": "nvidia,p3971-0000+p3834-0008\0nvidia,p3834-0008\0nvidia,tegra264",
        "boardids": "3834:0008",
        "rails": [("VDD_GPU", 19000, 600), ("VDD_CPU_SOC_MSS", 19000, 300), ("VIN_SYS_5V0", 5000, 1000)],
        "vin": (19000, 1500),
    },
}


def _write(root: Path, rel: str, value, end: str = "\n") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}{end}")


def _replace(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def set_current(root: str | os.PathLike, channel: int, milliamps: int, monitor: int = 1) -> None:
    """Atomically changes rail ``channel``'s current (1-based) on INA3221 ``monitor`` (1 or 2),
    read on the service's next tick."""
    _replace(Path(root) / (HWMON if monitor == 1 else HWMON_2) / f"curr{channel}_input", milliamps)


def set_vin_power(root: str | os.PathLike, microwatts: int) -> None:
    """Changes Thor's INA238 system-input power."""
    _replace(Path(root) / HWMON_238 / "power1_input", microwatts)


def set_gpu_temperature(root: str | os.PathLike, millidegrees: int) -> None:
    """Changes the gpu-thermal zone's temperature (thermal_zone1), read on the service's next tick."""
    _replace(Path(root) / "sys/devices/virtual/thermal/thermal_zone1/temp", millidegrees)


def set_gpu_frequency(root: str | os.PathLike, hertz: int) -> None:
    """Changes the GPU's current devfreq clock, as DVFS or a throttle would."""
    _replace(Path(root) / "sys/devices/platform/17000000.gpu/devfreq/17000000.gpu/cur_freq", hertz)


def rail_power_mw(millivolts: int, milliamps: int) -> int:
    """The power jtop 7.2.2 computes for an INA3221 channel: int(mV · mA / 1000) mW."""
    return int(millivolts * (float(milliamps) / 1000))


def plant(root: str | os.PathLike, board: str) -> Path:
    """Writes a JetPack 6.2 (L4T 36.4.3) tree for ``board`` under ``root``."""
    root, spec = Path(root), BOARDS[board]
    _write(root, "etc/nv_tegra_release", "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64")
    _write(root, "sys/firmware/devicetree/base/model", spec["model"], end="\0")
    _write(root, "sys/firmware/devicetree/base/serial-number", "1421000000000", end="\0")
    _write(root, "proc/device-tree/nvidia,boardids", spec["boardids"], end="\0")
    _write(root, "proc/device-tree/compatible", spec["compatible"], end="\0")
    for device, hwmon, rails in ((INA, HWMON, spec["rails"]), (INA_2, HWMON_2, spec.get("rails_2"))):
        if not rails:
            continue
        _write(root, device + "/name", "ina3221")
        for channel, (label, millivolts, milliamps) in enumerate(rails, start=1):
            for name, value in (("in%d_label", label), ("in%d_input", millivolts), ("curr%d_input", milliamps),
                                ("curr%d_max", 32760), ("curr%d_crit", 32760)):
                _write(root, f"{hwmon}/{name % channel}", value)
        _write(root, hwmon + "/in7_label", "sum of shunt voltages")
    if "vin" in spec:
        millivolts, milliamps = spec["vin"]
        _write(root, INA238 + "/name", "ina238")
        for name, value in (("in1_input", millivolts), ("curr1_input", milliamps),
                            ("power1_input", millivolts * milliamps)):  # µW
            _write(root, f"{HWMON_238}/{name}", value)
    gpu = root / "sys/devices/platform/17000000.gpu"
    for name, value in (("of_node/name", "gpu"), ("load", 655), ("railgate_enable", 1), ("tpc_pg_mask", 0),
                        ("enable_3d_scaling", 1)):
        _write(gpu, name, value)
    freq = gpu / "devfreq/17000000.gpu"
    for name, value in (("cur_freq", 624750000), ("max_freq", 1020000000), ("min_freq", 306000000),
                        ("governor", "nvhost_podgov")):
        _write(freq, name, value)
    os.symlink("../..", freq / "device")
    (root / "sys/class/devfreq").mkdir(parents=True, exist_ok=True)
    os.symlink("../../devices/platform/17000000.gpu/devfreq/17000000.gpu", root / "sys/class/devfreq/17000000.gpu")
    for index, (name, millidegrees) in enumerate((("cpu-thermal", 48250), ("gpu-thermal", 46500), ("tj-thermal", 48500))):
        _write(root, f"sys/devices/virtual/thermal/thermal_zone{index}/type", name)
        _write(root, f"sys/devices/virtual/thermal/thermal_zone{index}/temp", millidegrees)
    (root / "sys/class/power_supply").mkdir(parents=True, exist_ok=True)
    _write(root, "sys/class/hwmon/hwmon2/name", "pwmfan")
    _write(root, "sys/class/hwmon/hwmon2/pwm1", 96)
    for name, value in (("rate", 2133000000), ("max_rate", 3199000000), ("min_rate", 204000000),
                        ("mrq_rate_locked", 3199000000)):
        _write(root, f"sys/kernel/debug/bpmp/debug/clk/emc/{name}", value)
    _write(root, "sys/kernel/actmon_avg_activity/mc_all", 0)
    stat = ["cpu  2671 25 719 94839 90 0 35 0 0 0"]
    for cpu in range(4):
        base = f"sys/devices/system/cpu/cpu{cpu}"
        _write(root, base + "/online", 1)
        _write(root, base + "/cpufreq/scaling_governor", "schedutil")
        for kind in ("scaling", "cpuinfo"):
            for name, value in (("min_freq", 115200), ("max_freq", 1728000), ("cur_freq", 1510400)):
                _write(root, f"{base}/cpufreq/{kind}_{name}", value)
        stat.append(f"cpu{cpu} 445 4 119 15806 15 0 5 0 0 0")
    _write(root, "proc/stat", "\n".join(stat + ["intr 0", "ctxt 0", "btime 1674644431"]))
    _write(root, "proc/meminfo", "\n".join([
        "MemTotal:        7802128 kB", "MemFree:         3201024 kB", "MemAvailable:    5100000 kB",
        "Buffers:           81920 kB", "Cached:          1650000 kB", "SwapCached:            0 kB",
        "SReclaimable:     120000 kB", "SwapTotal:       3901056 kB", "SwapFree:        3901056 kB",
        "NvMapMemUsed:     524288 kB"]))
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    (root / "nvpmodel_state").write_text("0")
    nvpmodel = bin_dir / "nvpmodel"
    nvpmodel.write_text(f"""#!/bin/sh
STATE="{root / 'nvpmodel_state'}"
case "$1" in
  -p) echo "NVPM VERB: PM_CONFIG: DEFAULT=15W(0)"; echo "NVPM VERB: POWER_MODEL: ID=0 NAME=15W";
      echo "NVPM VERB: POWER_MODEL: ID=1 NAME=MAXN_SUPER" ;;
  -q) id=$(cat "$STATE"); [ "$id" = 0 ] && echo "NV Power Mode: 15W" || echo "NV Power Mode: MAXN_SUPER"; echo "$id" ;;
  -m) echo "$2" > "$STATE" ;;
esac
""")
    nvpmodel.chmod(0o755)
    return root


def _redirecting_os(root: str) -> types.ModuleType:
    """A copy of ``os`` whose path functions see ``root`` in place of the redirected absolute paths."""

    def remap(path):
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        if isinstance(path, str) and (path == "/sys" or path.startswith(REDIRECTED)):
            return root + path
        return path

    def wrap(function):
        def wrapper(path, *args, **kwargs):
            return function(remap(path), *args, **kwargs)
        return wrapper

    os_path = types.ModuleType("os.path")
    os_path.__dict__.update(posixpath.__dict__)
    for name in ("exists", "lexists", "isfile", "isdir", "islink", "realpath", "getsize"):
        setattr(os_path, name, wrap(getattr(posixpath, name)))
    fake = types.ModuleType("os")
    fake.__dict__.update(os.__dict__)
    for name in ("listdir", "access", "stat", "lstat", "scandir", "walk", "readlink"):
        setattr(fake, name, wrap(getattr(os, name)))
    fake.path = os_path
    fake.remapped_open = wrap(builtins.open)
    return fake


def serve(root: str, sock: str) -> None:
    """Runs jtop's real JtopServer against ``root`` (in a process of its own; blocks)."""
    import platform

    os.environ["PATH"] = f"{root}/bin{os.pathsep}{os.environ.get('PATH', '')}"
    import jtop.core.config as config
    import jtop.core.hardware as hardware
    import jtop.core.jetson_clocks as jetson_clocks
    import jtop.core.jetson_variables as jetson_variables
    import jtop.service as service

    fake_os = _redirecting_os(root)
    for name, module in list(sys.modules.items()):
        if name.startswith("jtop.core.") and module is not None:
            if hasattr(module, "os"):
                module.os = fake_os
            module.open = fake_os.remapped_open
    aarch64 = types.ModuleType("platform")
    aarch64.__dict__.update(platform.__dict__)
    aarch64.machine = lambda: "aarch64"
    hardware.platform = aarch64

    def no_i2c(*args, **kwargs):  # never probe the build host's own I2C buses for an EEPROM
        raise OSError("no I2C in the simulation")

    jetson_variables.SMBus = no_i2c
    service.JTOP_PIPE = sock
    service.getgrnam = lambda name: grp.getgrgid(os.getgid())
    config.get_config_service = lambda data_folder=None: os.path.join(root, "jtop_config")
    jetson_clocks.PATH_JETSON_CLOCKS = [os.path.join(root, "bin", "jetson_clocks")]
    signal.signal(signal.SIGTERM, lambda *args: sys.exit(0))
    service.JtopServer(force=True).loop_for_ever()


class JtopService:
    """Starts the simulated service for a board and points this process's jtop client at it."""

    def __init__(self, tmp_path: Path, board: str):
        self.root = plant(tmp_path / "root", board)
        self.sock = str(tmp_path / "jtop.sock")
        self.log = tmp_path / "service.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "JtopService":
        repo = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.device.jetson_sim", str(self.root), self.sock], cwd=repo,
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"simulated jtop service did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        import jtop.service

        jtop.service.JTOP_PIPE = self.sock
        return self

    def pause(self) -> None:
        """SIGSTOPs the whole service: it publishes nothing until :meth:`resume` (a stall)."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILLs the whole service (its manager children too, as a crash would)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __exit__(self, *exc) -> None:
        try:
            self.resume()  # a paused service ignores SIGTERM until continued
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
