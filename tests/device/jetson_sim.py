"""A simulated Jetson for running the REAL jtop service (jetson-stats) on an x86 build host.

``plant(root, board)`` writes the sysfs/procfs files jtop reads for a board profile;
``set_current(root, channel, ma)`` changes a rail while the service runs; ``JtopService`` starts
``python -m tests.device.jetson_sim ROOT SOCK`` in its own session, where jtop's hard-coded
absolute paths are redirected into ``root`` (only inside jtop's own modules) and its socket,
config folder and group are moved to temporary places. Nothing of jtop itself is replaced.

Power modes: ``plant`` writes the board's nvpmodel configuration (``etc/nvpmodel.conf``, NVIDIA's
format) and two executables jtop's service runs, a simulated ``nvpmodel`` (on its PATH) and
``jetson_clocks`` (at jtop's patched path). Both are Python scripts (:func:`tool_main`) that keep
their state in the tree: ``nvpmodel -m ID`` writes the mode's CPU ``scaling_max_freq`` caps, GPU
devfreq ``max_freq`` cap and online cores into the fake sysfs, the way the real tool does, so "the
mode has taken effect" is checked on the same files jtop reads. A mode whose TPC power-gating mask
differs from the current one needs a reboot: jtop marks it unavailable and never sets it unless
forced; a forced set is recorded in ``reboots`` (a test asserts nobody forced one).
"""

from __future__ import annotations

import builtins
import grp
import json
import logging
import os
import posixpath
import shutil
import signal
import subprocess
import sys
import threading
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
    # JetPack 7 (L4T R38): jetson-stats 7.2.2 reads Thor's GPU through NVML, not sysfs (jtop/core/gpu.py
    # _initialize_gpu_method: is_thor() — a /sys/class/devfreq/gpu-gpc-0 folder — and check_jetpack_version() ≥ 7.0;
    # nvml_read_gpu_status gives freq max = nvmlDeviceGetMaxClockInfo in MHz). The simulation plants both and
    # answers NVML in the service's process (serve): its clocks are gpu-gpc-0's, in MHz.
    "thor": {
        "l4t": "# R38 (release), REVISION: 2.0, GCID: 41844464, BOARD: generic, EABI: aarch64",
        "gpu_devfreq": "sys/class/devfreq/gpu-gpc-0",
        "model": "NVIDIA Jetson AGX Thor Developer Kit",
        "compatible": "nvidia,p3971-0000+p3834-0008\0nvidia,p3834-0008\0nvidia,tegra264",
        "boardids": "3834:0008",
        "rails": [("VDD_GPU", 19000, 600), ("VDD_CPU_SOC_MSS", 19000, 300), ("VIN_SYS_5V0", 5000, 1000)],
        "vin": (19000, 1500),
    },
}


GPU_DEVFREQ = "sys/devices/platform/17000000.gpu/devfreq/17000000.gpu"
# The simulated Orin Nano 8GB's power modes: name, online cores, CPU cap (kHz, both clusters), GPU cap (Hz)
# and the TPC power-gating mask. Clocks and cores after NVIDIA's Jetson Linux developer guide (r36.4, "Supported
# Modes and Power Efficiency", Orin Nano series: 15W 6 cores / 1.51 GHz CPU / 625 MHz GPU, 7W 4 cores / 1.13 GHz /
# 420 MHz, MAXN SUPER 6 cores / 1.73 GHz / 1.02 GHz). Not taken from a board: the 7W mode's different TPC mask
# is this simulation's choice, so one mode needs a reboot the way jtop expects (a different mask). ``rails_ma``
# (VDD_IN, VDD_CPU_GPU_CV currents on the first INA3221, Orin Nano only) is SYNTHETIC: the guide lists clocks and
# cores, not watts; 15W's are the currents planted before modes existed.
ORIN_NANO_MODES = (
    {"id": 0, "name": "15W", "online": (1, 1, 1, 1, 1, 1), "cpu_max_khz": 1510400, "gpu_max_hz": 624750000,
     "tpc_pg_mask": 0, "rails_ma": (1200, 400)},
    {"id": 1, "name": "7W", "online": (1, 1, 1, 1, 0, 0), "cpu_max_khz": 1113600, "gpu_max_hz": 420750000,
     "tpc_pg_mask": 1, "rails_ma": (800, 200)},
    {"id": 2, "name": "MAXN_SUPER", "online": (1, 1, 1, 1, 1, 1), "cpu_max_khz": 1728000, "gpu_max_hz": 1020000000,
     "tpc_pg_mask": 0, "rails_ma": (2400, 1200)},
)
DEFAULT_MODE = 0
CPU_CLUSTERS = ((0, 1, 2, 3), (4, 5))  # Orin Nano: two A78AE clusters, one cpufreq policy each
CPU_MIN_KHZ, CPU_HW_MAX_KHZ, GPU_MIN_HZ = 115200, 1728000, 306000000
# The simulated AGX Orin's power modes, as NVIDIA's nvpmodel configuration for the AGX Orin module P3701-0000
# (nvpmodel_p3701_0000.conf, L4T r36) gives them: MAXN 12 cores, no CPU or GPU cap (the hardware maxima, 2.2016 GHz
# and 1.3005 GHz, are read back), TPC mask 0; MODE_15W 4 cores / 1.1136 GHz CPU / 408 MHz GPU / mask 248; MODE_30W
# 8 cores / 1.728 GHz / 612 MHz / mask 240; MODE_50W 12 cores / 1.4976 GHz / 816 MHz / mask 0 (the developer guide's
# "Supported Modes and Power Efficiency" table lists the same cores and caps per module). jtop decides a reboot by the
# mask, so 15W and 30W need one from MAXN or 50W. ``rails_ma`` (VDD_GPU_SOC, VDD_CPU_CV currents on the first
# INA3221) is SYNTHETIC; 50W's are the currents planted before modes existed, and the board starts in 50W
# (AGX_START_MODE), so a tree planted for the power tests reads as before.
AGX_ORIN_MODES = (
    {"id": 0, "name": "MAXN", "online": (1,) * 12, "cpu_max_khz": 2201600, "gpu_max_hz": 1300500000,
     "tpc_pg_mask": 0, "rails_ma": (3000, 1000)},
    {"id": 1, "name": "MODE_15W", "online": (1,) * 4 + (0,) * 8, "cpu_max_khz": 1113600, "gpu_max_hz": 408000000,
     "tpc_pg_mask": 248, "rails_ma": (300, 200)},
    {"id": 2, "name": "MODE_30W", "online": (1,) * 8 + (0,) * 4, "cpu_max_khz": 1728000, "gpu_max_hz": 612000000,
     "tpc_pg_mask": 240, "rails_ma": (450, 300)},
    {"id": 3, "name": "MODE_50W", "online": (1,) * 12, "cpu_max_khz": 1497600, "gpu_max_hz": 816000000,
     "tpc_pg_mask": 0, "rails_ma": (600, 400)},
)
AGX_START_MODE = 3
AGX_CPU_CLUSTERS = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))  # three A78AE clusters of four
AGX_CPU_HW_MAX_KHZ = 2201600
# Which table each simulated board runs: (modes, CPU clusters, hardware CPU max kHz, start mode, rails set by
# the mode). Thor keeps the Orin Nano table with its rails left alone, as before modes were per board.
BOARD_MODES = {"orin-nano": (ORIN_NANO_MODES, CPU_CLUSTERS, CPU_HW_MAX_KHZ, DEFAULT_MODE, True),
               "agx-orin": (AGX_ORIN_MODES, AGX_CPU_CLUSTERS, AGX_CPU_HW_MAX_KHZ, AGX_START_MODE, True),
               "thor": (ORIN_NANO_MODES, CPU_CLUSTERS, CPU_HW_MAX_KHZ, DEFAULT_MODE, False)}


def _write(root: Path, rel: str, value, end: str = "\n") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}{end}")


def _replace(path: Path, value) -> None:
    # A temporary name of each writer's own: the thermal plant's thread and the simulated tools write cur_freq at once.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
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
    _replace(gpu_devfreq(root) / "cur_freq", hertz)


def rail_power_mw(millivolts: int, milliamps: int) -> int:
    """The power jtop 7.2.2 computes for an INA3221 channel: int(mV · mA / 1000) mW."""
    return int(millivolts * (float(milliamps) / 1000))


def plant(root: str | os.PathLike, board: str) -> Path:
    """Writes a JetPack 6.2 (L4T 36.4.3) tree for ``board`` under ``root``."""
    root, spec = Path(root), BOARDS[board]
    _write(root, "etc/nv_tegra_release",
           spec.get("l4t", "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64"))
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
    if "gpu_devfreq" in spec:  # Thor's GPC clock domain (Hz, as devfreq reports)
        for name, value in (("cur_freq", 624750000), ("max_freq", 1020000000), ("min_freq", 306000000),
                            ("governor", "nvhost_podgov")):
            _write(root, f"{spec['gpu_devfreq']}/{name}", value)
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
    modes, clusters, hw_max_khz, start, rails = BOARD_MODES[board]
    for cpu in range(len(modes[0]["online"])):
        base = f"sys/devices/system/cpu/cpu{cpu}"
        _write(root, base + "/online", 1)
        _write(root, base + "/cpufreq/scaling_governor", "schedutil")
        for kind in ("scaling", "cpuinfo"):
            for name, value in (("min_freq", CPU_MIN_KHZ), ("max_freq", hw_max_khz), ("cur_freq", 1510400)):
                _write(root, f"{base}/cpufreq/{kind}_{name}", value)
        stat.append(f"cpu{cpu} 445 4 119 15806 15 0 5 0 0 0")
    _write(root, "proc/stat", "\n".join(stat + ["intr 0", "ctxt 0", "btime 1674644431"]))
    _write(root, "proc/meminfo", "\n".join([
        "MemTotal:        7802128 kB", "MemFree:         3201024 kB", "MemAvailable:    5100000 kB",
        "Buffers:           81920 kB", "Cached:          1650000 kB", "SwapCached:            0 kB",
        "SReclaimable:     120000 kB", "SwapTotal:       3901056 kB", "SwapFree:        3901056 kB",
        "NvMapMemUsed:     524288 kB"]))
    plant_power_modes(root, modes, start, rails=rails, clusters=clusters,
                      devfreq=spec.get("gpu_devfreq", GPU_DEVFREQ))
    return root


def nvpmodel_conf(modes, clusters=CPU_CLUSTERS, devfreq: str = GPU_DEVFREQ) -> str:
    """``modes`` in the format of NVIDIA's ``/etc/nvpmodel.conf`` (PARAM definitions, then POWER_MODELs), with one
    CPU clock per cluster of ``clusters``."""
    cores = len(modes[0]["online"])
    lines = ["< PARAM TYPE=FILE NAME=CPU_ONLINE >"]
    lines += [f"CORE_{cpu} /sys/devices/system/cpu/cpu{cpu}/online" for cpu in range(cores)]
    lines += ["< PARAM TYPE=FILE NAME=TPC_POWER_GATING >", "TPC_PG_MASK /sys/devices/platform/17000000.gpu/tpc_pg_mask"]
    for index, cluster in enumerate(clusters):
        base = f"/sys/devices/system/cpu/cpu{cluster[0]}/cpufreq"
        lines += [f"< PARAM TYPE=CLOCK NAME=CPU_A78_{index} >", f"FREQ_TABLE {base}/scaling_available_frequencies",
                  f"MAX_FREQ {base}/scaling_max_freq", f"MIN_FREQ {base}/scaling_min_freq"]
    lines += ["< PARAM TYPE=CLOCK NAME=GPU >", f"FREQ_TABLE /{devfreq}/available_frequencies",
              f"MAX_FREQ /{devfreq}/max_freq", f"MIN_FREQ /{devfreq}/min_freq", ""]
    for mode in modes:
        lines.append(f"< POWER_MODEL ID={mode['id']} NAME={mode['name']} >")
        lines += [f"CPU_ONLINE CORE_{cpu} {online}" for cpu, online in enumerate(mode["online"])]
        lines.append(f"TPC_POWER_GATING TPC_PG_MASK {mode['tpc_pg_mask']}")
        for index in range(len(clusters)):
            lines += [f"CPU_A78_{index} MIN_FREQ {CPU_MIN_KHZ}", f"CPU_A78_{index} MAX_FREQ {mode['cpu_max_khz']}"]
        lines += [f"GPU MIN_FREQ {GPU_MIN_HZ}", f"GPU MAX_FREQ {mode['gpu_max_hz']}", ""]
    lines.append(f"< PM_CONFIG DEFAULT={modes[0]['id']} >")
    return "\n".join(lines) + "\n"


def plant_power_modes(root: Path, modes, current: int, rails: bool = False, clusters=CPU_CLUSTERS,
                      devfreq: str = GPU_DEVFREQ) -> None:
    """Writes the nvpmodel configuration, the two simulated tools and their state, and applies mode ``current``
    (``rails``: a mode also sets its synthetic rail currents; ``devfreq``: the GPU clock domain a mode caps)."""
    _write(root, "etc/nvpmodel.conf", nvpmodel_conf(modes, clusters, devfreq), end="")
    (root / "sim_modes.json").write_text(json.dumps({"modes": list(modes), "rails": rails, "gpu_devfreq": devfreq}))
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    repo = str(Path(__file__).resolve().parents[2])
    for tool in ("nvpmodel", "jetson_clocks"):
        script = bin_dir / tool
        # jtop's service runs `nvpmodel -q` on every tick: answered by the shell, not a Python start-up, so a
        # 20 Hz sampler keeps its rate. The rest runs tool_main (absolute interpreter and repository paths).
        query = (f'if [ "$1" = "-q" ]; then echo "NV Fan Mode:quiet"; '
                 f'echo "NV Power Mode: $(cat "{root}/nvpmodel_name")"; cat "{root}/nvpmodel_state"; exit 0; fi\n'
                 if tool == "nvpmodel" else "")
        script.write_text(f"#!/bin/sh\n{query}exec {sys.executable} -c 'import sys; sys.path.insert(0, sys.argv[1]); "
                          "from tests.device.jetson_sim import tool_main; "
                          "sys.exit(tool_main(sys.argv[2], sys.argv[3], sys.argv[4:]))' "
                          f"{repo!r} {tool} {str(root)!r} \"$@\"\n")
        script.chmod(0o755)
    _apply_mode(root, current)


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def gpu_devfreq(root: str | os.PathLike) -> Path:
    """The GPU clock domain of the board planted at ``root`` (17000000.gpu on Orin, gpu-gpc-0 on Thor)."""
    root = Path(root)
    planted = root / "sim_modes.json"
    name = json.loads(planted.read_text()).get("gpu_devfreq", GPU_DEVFREQ) if planted.exists() else GPU_DEVFREQ
    return root / name


def mode_state(root: str | os.PathLike) -> dict:
    """What the simulated board runs now: ``{"id", "name", "jetson_clocks", "gpu_max_hz", "cpu_max_khz",
    "online"}``, read from the tree (a test's view, independent of jtop and the agent)."""
    root = Path(root)
    modes = json.loads((root / "sim_modes.json").read_text())["modes"]
    current = _read_int(root / "nvpmodel_state")
    cpus = _cpu_dirs(root)
    online = [_read_int(cpu / "online") for cpu in cpus]
    return {"id": current, "name": modes[current]["name"], "jetson_clocks": _clocks_pinned(root),
            "gpu_max_hz": _read_int(gpu_devfreq(root) / "max_freq"),
            "cpu_max_khz": _read_int(cpus[0] / "cpufreq/scaling_max_freq"), "online": online}


def store_jetson_clocks(root: str | os.PathLike, mode_id: int) -> Path:
    """Plants the file jtop's service stores on its first start and restores from whenever it switches
    jetson_clocks off, as if stored while the board ran ``mode_id`` (the board then goes back to the mode it was
    in). Call before the service starts: it stores no file when one exists."""
    root = Path(root)
    current = _read_int(root / "nvpmodel_state")
    _apply_mode(root, mode_id)
    stored = root / "jtop_config" / "l4t_dfs.conf"
    stored.parent.mkdir(parents=True, exist_ok=True)
    _jetson_clocks(root, ["--store", str(stored)])
    _apply_mode(root, current)
    return stored


def set_mode(root: str | os.PathLike, mode_id: int) -> None:
    """Puts the simulated board in mode ``mode_id`` behind jtop's back (as a sweep killed mid-way leaves it)."""
    _apply_mode(Path(root), mode_id)


def set_nvpmodel_fault(root: str | os.PathLike, fault: str | None) -> None:
    """``gpu_cap_stuck``: later ``nvpmodel -m`` calls record the mode but leave the GPU cap where it was
    (a mode that never takes effect); None clears it."""
    path = Path(root) / "nvpmodel_fault"
    if fault is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(fault)


def _cpu_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("sys/devices/system/cpu/cpu[0-9]*"), key=lambda path: int(path.name[3:]))


def _clocks_pinned(root: Path) -> bool:
    # What jtop's jetson_clocks_alive() checks: every online core's and the GPU's min == max, EMC at its max.
    for cpu in _cpu_dirs(root):
        if _read_int(cpu / "online") and _read_int(cpu / "cpufreq/scaling_min_freq") != \
                _read_int(cpu / "cpufreq/scaling_max_freq"):
            return False
    gpu = gpu_devfreq(root)
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    return _read_int(gpu / "min_freq") == _read_int(gpu / "max_freq") and \
        _read_int(emc / "rate") == _read_int(emc / "max_rate")


def _apply_mode(root: Path, mode_id: int) -> None:
    """What ``nvpmodel -m`` does to sysfs: online cores, CPU and GPU caps (minimums and clocks kept under them)."""
    data = json.loads((root / "sim_modes.json").read_text())
    mode = data["modes"][mode_id]
    fault = (root / "nvpmodel_fault").read_text().strip() if (root / "nvpmodel_fault").exists() else ""
    cpus = _cpu_dirs(root)
    for cpu, online in zip(cpus, mode["online"]):
        _replace(cpu / "online", online)
    for cpu in cpus:  # one cpufreq policy per cluster: every core of it takes the cap
        freq = cpu / "cpufreq"
        _replace(freq / "scaling_max_freq", mode["cpu_max_khz"])
        for name in ("scaling_min_freq", "scaling_cur_freq"):
            _replace(freq / name, min(_read_int(freq / name), mode["cpu_max_khz"]))
    gpu = gpu_devfreq(root)
    if fault != "gpu_cap_stuck":
        _replace(gpu / "max_freq", mode["gpu_max_hz"])
        for name in ("min_freq", "cur_freq"):
            _replace(gpu / name, min(_read_int(gpu / name), mode["gpu_max_hz"]))
    _replace(root / "sys/devices/platform/17000000.gpu/tpc_pg_mask", mode["tpc_pg_mask"])
    if data["rails"]:
        for channel, milliamps in enumerate(mode["rails_ma"], start=1):
            set_current(root, channel, milliamps)
    _replace(root / "nvpmodel_name", mode["name"])
    _replace(root / "nvpmodel_state", mode_id)


def _nvpmodel(root: Path, args: list[str]) -> int:
    """The real tool's output lines as jtop 7.2.2 parses them (``NVPM VERB: POWER_MODEL: ID=… NAME=…``,
    ``TPC_POWER_GATING TPC_PG_MASK …``, ``NV Power Mode: …`` then the id)."""
    modes = json.loads((root / "sim_modes.json").read_text())["modes"]
    current = _read_int(root / "nvpmodel_state")
    if args[:1] == ["-p"]:
        print("NVPM VERB: Config file: /etc/nvpmodel.conf")
        print("NVPM VERB: parsing done for /etc/nvpmodel.conf")
        print(f"NVPM VERB: PM_CONFIG: DEFAULT={modes[0]['name']}({modes[0]['id']})")
        for mode in modes:
            print(f"NVPM VERB: POWER_MODEL: ID={mode['id']} NAME={mode['name']}")
            for cpu, online in enumerate(mode["online"]):
                print(f"NVPM VERB: CPU_ONLINE CORE_{cpu} {online}")
            print(f"NVPM VERB: TPC_POWER_GATING TPC_PG_MASK {mode['tpc_pg_mask']}")
            print(f"NVPM VERB: GPU MAX_FREQ {mode['gpu_max_hz']}")
        return 0
    if args[:1] == ["-q"]:
        print("NV Fan Mode:quiet")
        print(f"NV Power Mode: {modes[current]['name']}")
        print(current)
        return 0
    if args[:1] == ["-m"] and len(args) > 1:
        target = int(args[1])
        if not 0 <= target < len(modes):
            print(f"NVPM ERROR: Invalid mode id {target}")
            return 1
        if modes[target]["tpc_pg_mask"] != modes[current]["tpc_pg_mask"]:
            print(f"NVPM WARN: Reboot required for changing to this power mode: {target}")
            print("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:")
            answer = sys.stdin.readline().strip()
            if answer.lower() != "yes":
                return 0
            with open(root / "reboots", "a") as log:  # a forced mode reboots the board: never in a test
                log.write(f"{target}\n")
        _apply_mode(root, target)
        return 0
    print(f"nvpmodel (simulated): unknown arguments {args}", file=sys.stderr)
    return 2


def _jetson_clocks(root: Path, args: list[str]) -> int:
    """``--show``, ``--store FILE``, ``--restore FILE``, or no argument: pin CPU, GPU and EMC at their caps."""
    cpus, gpu = _cpu_dirs(root), gpu_devfreq(root)
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    if args[:1] == ["--show"]:
        print("SOC family:tegra234  Machine:NVIDIA Jetson Orin Nano (simulated)")
        for index, cpu in enumerate(cpus):
            freq = cpu / "cpufreq"
            print(f"cpu{index}: Online={_read_int(cpu / 'online')} Governor=schedutil "
                  f"MinFreq={_read_int(freq / 'scaling_min_freq')} MaxFreq={_read_int(freq / 'scaling_max_freq')} "
                  f"CurrentFreq={_read_int(freq / 'scaling_cur_freq')} IdleStates: C1=1 c7=1 ")
        print(f"GPU MinFreq={_read_int(gpu / 'min_freq')} MaxFreq={_read_int(gpu / 'max_freq')} "
              f"CurrentFreq={_read_int(gpu / 'cur_freq')}")
        print(f"EMC MinFreq=204000000 MaxFreq={_read_int(emc / 'max_rate')} CurrentFreq={_read_int(emc / 'rate')} "
              "FreqOverride=0")
        return 0
    if args[:1] == ["--store"] and len(args) > 1:
        # NVIDIA's script stores each core's online state and cpufreq min and max, the GPU's min and max and
        # EMC, and --restore writes every one back: the cores and caps of the mode the file was stored under.
        saved = {"online": [_read_int(cpu / "online") for cpu in cpus],
                 "cpu_min_khz": [_read_int(cpu / "cpufreq/scaling_min_freq") for cpu in cpus],
                 "cpu_max_khz": [_read_int(cpu / "cpufreq/scaling_max_freq") for cpu in cpus],
                 "gpu_min_hz": _read_int(gpu / "min_freq"), "gpu_max_hz": _read_int(gpu / "max_freq"),
                 "emc_hz": _read_int(emc / "rate")}
        Path(args[1]).write_text(json.dumps(saved))
        print(f"stored in {args[1]}")
        return 0
    if args[:1] == ["--restore"] and len(args) > 1:
        saved = json.loads(Path(args[1]).read_text())
        for cpu, online, low, high in zip(cpus, saved["online"], saved["cpu_min_khz"], saved["cpu_max_khz"]):
            freq = cpu / "cpufreq"
            _replace(cpu / "online", online)
            _replace(freq / "scaling_max_freq", high)
            _replace(freq / "scaling_min_freq", min(low, high))
            _replace(freq / "scaling_cur_freq", min(_read_int(freq / "scaling_cur_freq"), high))
        _replace(gpu / "max_freq", saved["gpu_max_hz"])
        _replace(gpu / "min_freq", min(saved["gpu_min_hz"], saved["gpu_max_hz"]))
        _replace(gpu / "cur_freq", min(_read_int(gpu / "cur_freq"), saved["gpu_max_hz"]))
        _replace(emc / "rate", saved["emc_hz"])
        return 0
    if not args:
        for cpu in cpus:
            freq = cpu / "cpufreq"
            cap = _read_int(freq / "scaling_max_freq")
            _replace(freq / "scaling_min_freq", cap)
            _replace(freq / "scaling_cur_freq", cap)
        for name in ("min_freq", "cur_freq"):
            _replace(gpu / name, _read_int(gpu / "max_freq"))
        _replace(emc / "rate", _read_int(emc / "max_rate"))
        return 0
    print(f"jetson_clocks (simulated): unknown arguments {args}", file=sys.stderr)
    return 2


def tool_main(tool: str, root: str, args: list[str]) -> int:
    """Entry point of the simulated ``nvpmodel`` and ``jetson_clocks`` executables planted in ``root/bin``."""
    return (_nvpmodel if tool == "nvpmodel" else _jetson_clocks)(Path(root), args)


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

    def remapped_open(path, mode="r", *args, **kwargs):
        path = remap(path)
        if not any(flag in mode for flag in "wax+"):
            return builtins.open(path, mode, *args, **kwargs)
        return _ReplacedOnClose(path, mode, *args, **kwargs)

    fake.remapped_open = remapped_open
    return fake


class _ReplacedOnClose:
    """A file written beside its path and moved over it on close. A sysfs attribute is replaced whole by a write;
    a regular file is truncated first, and jtop's reader thread once read the fan's pwm1 as '' while its own
    jetson_clocks code rewrote it, which killed the service (ValueError in fan.get_status)."""

    def __init__(self, path, mode, *args, **kwargs):
        self._path, self._temporary = path, f"{path}.sim-{os.getpid()}-{threading.get_ident()}"
        if "a" in mode or "+" in mode:
            shutil.copyfile(path, self._temporary)
        self._handle = builtins.open(self._temporary, mode, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if not self._handle.closed:
            self._handle.close()
            os.replace(self._temporary, self._path)


def serve(root: str, sock: str, version: str | None = None) -> None:
    """Runs jtop's real JtopServer against ``root`` (in a process of its own; blocks).

    Args:
        version: The release the service announces in its init message instead of its own (a board whose
            service is another jetson-stats: jetson-stats 7.2.2's JtopServer keeps it in ``_version`` and sends it
            as ``init["version"]``, jtop/service.py at 7.2.2; the client compares major.minor, jtop/jtop.py start()).
    """
    import platform

    os.environ["PATH"] = f"{root}/bin{os.pathsep}{os.environ.get('PATH', '')}"
    devfreq = gpu_devfreq(root)
    if devfreq.name == "gpu-gpc-0":  # jtop's gpu.py imports pynvml when it is imported: answer before that
        sys.modules["pynvml"] = thor_nvml(devfreq)
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
    ready = Path(root) / "service_ready"
    ready.unlink(missing_ok=True)

    class Ready(logging.Handler):
        # The service logs "service ready" once jetson_clocks is initialised (two tool runs) and it reads its
        # queue: a client connecting before that waits past its first-data timeout ("Error connection").
        def emit(self, record):
            if record.getMessage() == "service ready":
                ready.touch()

    service.logger.setLevel(logging.INFO)  # the last-resort handler still prints only warnings to the log
    service.logger.addHandler(Ready(logging.INFO))
    first_delay_s = float(os.environ.get(FIRST_STATS_DELAY, "0") or 0)
    if first_delay_s:
        # Planted (tests only): the service's first value comes late, as on a busy board.
        stats, delayed = service.JtopServer.jtop_stats, []

        def late_first_stats(self):
            if not delayed:
                delayed.append(True)
                time.sleep(first_delay_s)
            return stats(self)

        service.JtopServer.jtop_stats = late_first_stats
    tick_s = float(os.environ.get(TICK_S, "0") or 0)
    if tick_s:
        # Planted (tests only): a tick as slow as a board's (`nvpmodel -q`, the process table) delivers slower
        # than the interval its first client configured.
        measured = service.JtopServer.jtop_stats

        def slow_stats(self):
            time.sleep(tick_s)
            return measured(self)

        service.JtopServer.jtop_stats = slow_stats
    server = service.JtopServer(force=True)
    if version:
        server._version = version
    server.loop_for_ever()


def thor_nvml(devfreq: Path) -> types.ModuleType:
    """A STAND-IN ``pynvml`` for the simulated Thor's jtop service: the calls jetson-stats 7.2.2's
    nvml_read_gpu_status makes (jtop/core/gpu.py), answered from the planted gpu-gpc-0 clock domain. Clocks in MHz as
    NVML gives them; the maximum is the domain's ``max_freq``, i.e. the power mode's cap — whether a real Thor's
    nvmlDeviceGetMaxClockInfo reports the mode's cap or the hardware's is not confirmed by any source read. Anything
    else raises NVMLError_NotSupported, which jtop's _safe_nvml_call turns into None, as on a Jetson."""
    module = types.ModuleType("pynvml")
    module.__doc__ = "STAND-IN for pynvml (tests/device/jetson_sim.py), not NVML"

    class NVMLError(Exception):
        pass

    def mhz(name: str) -> int:
        return _read_int(devfreq / name) // 1_000_000

    module.NVMLError = module.NVMLError_NotSupported = NVMLError
    module.NVML_CLOCK_SM, module.NVML_CLOCK_MEM, module.NVML_TEMPERATURE_GPU = 1, 2, 0
    module.nvmlInit = module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: 1
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetName = lambda handle: "NVIDIA Thor"
    module.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=35, memory=0)
    module.nvmlDeviceGetClockInfo = lambda handle, clock: mhz("cur_freq") if clock == module.NVML_CLOCK_SM else None
    module.nvmlDeviceGetMaxClockInfo = lambda handle, clock: mhz("max_freq")

    def not_supported(name: str):
        def call(*args, **kwargs):
            raise NVMLError(f"{name}: Not Supported (simulated Thor)")
        return call

    module.__getattr__ = lambda name: not_supported(name) if name.startswith("nvml") else (_ for _ in ()).throw(
        AttributeError(name))
    return module


def _listening(path: str) -> bool:
    """Whether a Unix socket at ``path`` accepts connections: its file appears at bind(), connections are refused
    until listen(), and a loaded host can stretch that gap. Read from /proc/net/unix (flag __SO_ACCEPTCON), not by
    connecting: a probe would hand the service's manager a client that fails its handshake."""
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return os.path.exists(path)
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == path and int(fields[3], 16) & 0x10000:
            return True
    return False


FIRST_STATS_DELAY = "EDGEFOLD_SIM_FIRST_STATS_DELAY_S"
"""Environment of the simulated service: its first published value comes this many seconds late (tests only)."""
TICK_S = "EDGEFOLD_SIM_TICK_S"
"""Environment of the simulated service: each of its ticks takes at least this long (tests only)."""


class JtopService:
    """Starts the simulated service for a board and points this process's jtop client at it.

    Args:
        first_stats_delay_s: Plants a service whose first value comes this late (:data:`FIRST_STATS_DELAY`).
        tick_s: Plants a service whose every tick takes this long (:data:`TICK_S`).
    """

    def __init__(self, tmp_path: Path, board: str, version: str | None = None, first_stats_delay_s: float = 0.0,
                 tick_s: float = 0.0):
        self.version, self.first_stats_delay_s, self.tick_s = version, first_stats_delay_s, tick_s
        self.root = plant(tmp_path / "root", board)
        self.sock = str(tmp_path / "jtop.sock")
        self.log = tmp_path / "service.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "JtopService":
        repo = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.device.jetson_sim", str(self.root), self.sock, *([self.version] if self.version else [])], cwd=repo,
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, FIRST_STATS_DELAY: str(self.first_stats_delay_s), TICK_S: str(self.tick_s)})
        # A Jetson's jtop service has the board to itself; here it shares two cores with another test worker,
        # which stalled it past the samplers' staleness limit (every window's energy degraded, nothing chosen).
        # Raised before it starts its own children, which inherit it; root only (as the service itself).
        try:
            os.setpriority(os.PRIO_PROCESS, self.process.pid, -10)
        except OSError:
            pass
        deadline = time.monotonic() + 30
        while not (_listening(self.sock) and (self.root / "service_ready").exists()):
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
    serve(*sys.argv[1:4])
