"""A sustained sweep on the simulated Orin Nano: ``edgefold sustain --swept`` against a PLANTED heat curve.

    sudo .venv/bin/python bench/sustain_sim.py --run runs/tiny/latest --minutes 2

Goal, stated before it runs: the report's "After N minutes" recovers what the plant set, on a board whose heat is
known. The plant (tests/device/thermal_plant.py, SYNTHETIC) settles at 30 °C + 8 °C/W × the board's planted input
power: MAXN_SUPER (12.2 W) at 127.5 °C, past the 90 °C passive trip point, where the GPU clock halves (100 → 50 MHz:
settled ÷ burst 2.0 planted); 15W (6.1 W) at 78.8 °C, below it (1.0). The 15W run waits until every zone is below
85 °C (MAXN_SUPER's heat). Pass: each throttle moment within one recording interval of the plant's, each ratio
within 3% of the planted one, the mode found restored.

It copies a finished classification run (``--run``, e.g. ``make edge MODEL=tiny``'s), starts the REAL jtop service
on the simulated Orin Nano, the clocked TensorRT stand-in (its calls follow the GPU clock) and an agent, and runs
``edgefold sustain`` on it; the plant heats from the moment the first sustained run starts. It writes
``bench/results/sustain-sim-<stamp>.md``: the machine, the goal, planted against found, and the report's section as
the report wrote it. The service insists on running as root. The board is simulated: its numbers are the plant's,
not a Jetson's.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PLANT = {"start_c": 50.0, "ambient_c": 30.0, "c_per_w": 8.0, "tau_s": 20.0, "trip_c": 90.0, "critical_c": 140.0,
         "initial_hz": 100_000_000, "throttled_hz": 50_000_000}
PLANTED_RATIO = {"MAXN_SUPER": 2.0, "15W": 1.0}


def machine() -> str:
    """The CPU model and its vector extensions, as lscpu names them."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = [flag for flag in ("avx2", "avx512f", "amx_tile") if flag in fields.get("Flags", "")]
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs, {' '.join(flags)}"


def main() -> int:
    from pipeline.cli import main as edgefold
    from tests.device.agent_process import AgentProcess
    from tests.device.clocked_runtime import sitecustomize_dir
    from tests.device.jetson_sim import JtopService, mode_state
    from tests.device.thermal_plant import ZONES, ThermalPlant, heating_with_the_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a finished classification run (runs/<model>/<run-id>)")
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = Path(args.run).resolve()
        # Where edgefold writes it again: runs/<the run's model>/<its id>.
        run = tmp / "runs" / json.loads((source / "manifest.json").read_text())["model"] / "sustain"
        shutil.copytree(source, run, symlinks=True)
        with JtopService(tmp / "board", "orin-nano") as svc:
            _, env = sitecustomize_dir(tmp / "site", svc.root, "10.3.0")
            plant = ThermalPlant(svc.root, **PLANT)
            before = mode_state(svc.root)
            agent_args = ("--jtop-socket", svc.sock, "--thermal-dir", str(svc.root / ZONES), "--nvpmodel-conf",
                          str(svc.root / "etc/nvpmodel.conf"))
            with AgentProcess(tmp / "agent", env=env, args=agent_args) as agent:
                started = time.monotonic()
                with heating_with_the_run(agent, plant):  # from the first sustained run's start
                    code = edgefold(["sustain", str(run), "--minutes", f"{args.minutes:g}", "--swept",
                                     "--cool-below-c", "85", "--cool-max-s", "120", "--edge", agent.url,
                                     "--token-file", str(agent.token_file),
                                     "--set", "deploy.sweep.modes=[MAXN_SUPER, 15W]",
                                     "--set", "deploy.rungs=[teacher, student_int8]",
                                     "--set", "deploy.evaluate_images=0", "--set", "deploy.duration_s=0.3",
                                     "--set", "deploy.frame.source=synthetic",  # a run made with frames from images
                                     "--set", "deploy.batch_sizes=[1]", "--set", "deploy.runtime=tensorrt"])
                wall_s = time.monotonic() - started
            after = mode_state(svc.root)
        data = json.loads((run / "report" / "results.json").read_text())
        markdown = (run / "report" / "report.md").read_text()

    found = [r for r in data["sustained"] if r["device"] == "edge"]
    rows, passed = [], code == 0 and after == before
    for result in found:
        mode = result["setting"].split(",")[0]
        throttled = plant.first("throttled", after=result["started_at"])
        ends = result["started_at"] + result["intervals"][-1]["end_s"]
        planted_s = throttled - result["started_at"] if throttled is not None and throttled <= ends else None
        interval = result["intervals"][0]["end_s"]
        moment_ok = (planted_s is None and result["first_throttle_s"] is None) or (
            planted_s is not None and result["first_throttle_s"] is not None
            and planted_s <= result["first_throttle_s"] <= planted_s + interval + 0.5)
        ratio_ok = abs(result["ratio"] / PLANTED_RATIO[mode] - 1) <= 0.03
        passed &= moment_ok and ratio_ok
        planted_text = "—" if planted_s is None else f"{planted_s:.1f}"
        found_text = "—" if result["first_throttle_s"] is None else f"{result['first_throttle_s']:.1f}"
        rows.append(f"| {result['setting']} | {planted_text} | {found_text} ({result['throttle_cause']}) | {PLANTED_RATIO[mode]:.2f} | {result['ratio']:.3f} "
                    f"[{result['ratio_low']:.3f}, {result['ratio_high']:.3f}] | {result.get('cooling') or '—'} | "
                    f"{'yes' if moment_ok and ratio_ok else 'NO'} |")
    section = markdown[markdown.index("## After "):]
    section = section[:section.index("\n## ", 3)] if "\n## " in section[3:] else section
    lines = [f"# A sustained sweep on the simulated Orin Nano ({stamp})", "",
             f"Machine: {machine()}; Python {platform.python_version()}. One run; {wall_s:.0f} s wall-clock.", "",
             "Goal (before the run): " + " ".join(__doc__.split("Goal, stated before it runs: ", 1)[1]
                                                 .split("\n\n", 1)[0].split()), "",
             f"Plant: {json.dumps(PLANT)}. `edgefold sustain --minutes {args.minutes:g} --swept --cool-below-c 85 "
             "--cool-max-s 120`, `deploy.sweep.modes=[MAXN_SUPER, 15W]`.", "",
             "| setting | planted throttle, s into the run | found, s (cause) | planted ratio | found ratio [95% CI] | "
             "cooling | pass |", "|---|---|---|---|---|---|---|", *rows, "",
             f"Mode before {before['name']}, after {after['name']} (restored: {after == before}); edgefold exit code "
             f"{code}. **{'PASS' if passed else 'FAIL'}**.", "", "The report's section, as written:", "", section]
    out = Path(args.out) / f"sustain-sim-{stamp}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
