"""The agent's restore of a sweep's hold, in a process of its own: ``python -m device.service.hold restore --hold FILE``.

Its own module above both kinds of sweep: a Jetson's mode through jtop (:mod:`device.power.power_modes`; importing jtop
changes its process's multiprocessing start method, so the agent daemon never imports it) and a GPU's power limit
through NVML (:mod:`device.power.gpu_power`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from device.errors import DeviceError, MissingDependencyError
from device.power.gpu_power import restore_gpu_hold
from device.power.jtop_client import use_socket
from device.power.power_modes import DeviceState, ModeController, PowerModeError, read_hold, read_nvpmodel_conf


def restore_hold(path: str | Path, conf_path: str | Path | None, timeout_s: float = 60.0,
                 interval_s: float = 0.5) -> str | None:
    """Restores the state a hold recorded and removes the hold; nothing to do without one.

    Returns:
        What was restored (a sentence), or None when there was no hold.

    Raises:
        PowerModeError: The state could not be restored (the hold is kept); MissingDependencyError: no jtop.
    """
    held = read_hold(path)
    if held is None:
        return None
    job_id, original = held
    if not isinstance(original, DeviceState):  # a data-center GPU's power limit: NVML, not jtop
        restore_gpu_hold(original)
        Path(path).unlink(missing_ok=True)
        return f"restored {original.describe()} after sweep job {job_id}"
    caps = None
    if conf_path:
        try:
            caps = read_nvpmodel_conf(conf_path).get(original.nvpmodel_id)
        except PowerModeError:  # restoring matters more than checking the caps: jtop's mode id still tells
            caps = None
    with ModeController(interval_s) as controller:
        controller.restore(original, caps, timeout_s)
    Path(path).unlink(missing_ok=True)
    return f"restored {original.describe()} after sweep job {job_id}"


def main(argv: list[str] | None = None) -> int:
    """``python -m device.service.hold restore --hold FILE [--jtop-socket S] [--conf F]``: the agent's restore.

    Exit status 0: restored (or nothing held); 3: not restored, the reason on stderr.
    """
    parser = argparse.ArgumentParser(prog="python -m device.service.hold")
    sub = parser.add_subparsers(dest="command", required=True)
    restore = sub.add_parser("restore", help="restore the power mode a sweep's hold recorded")
    restore.add_argument("--hold", required=True, type=Path)
    restore.add_argument("--jtop-socket")
    restore.add_argument("--conf")
    restore.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    use_socket(args.jtop_socket)
    try:
        said = restore_hold(args.hold, args.conf, args.timeout_s)
    except (DeviceError, MissingDependencyError) as err:
        print(str(err), file=sys.stderr)
        return 3
    print(said or "nothing held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
