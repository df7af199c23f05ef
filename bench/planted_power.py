"""Planted power traces on the simulated Jetson: energy per image against the exact integral.

    sudo .venv/bin/python bench/planted_power.py --repeats 3 --rates 20 10

Runs the REAL jtop service (jetson-stats) on the simulated Orin Nano, AGX Orin and Thor trees of
``tests/device/jetson_sim.py``, changes the board's load rail at known instants (a 5 → 10 W step,
three 10 W spikes, a 0.25 s window, the service killed 65% into the window, the service paused
for 0.6 s) and compares the sampler's published energy per image with the exact one. A case
passes when its figure is within 2% of the exact energy or is flagged degraded. Reports, per case
and board, the worst error of the figures published unflagged, the worst of all published, how
many were flagged, and the sample rate achieved. The service insists on running as root.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    from tests.device.jetson_sim import JtopService
    from tests.device.planted import CASES, run_case

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rates", type=float, nargs="+", default=[20.0])
    parser.add_argument("--boards", nargs="+", default=["orin-nano", "agx-orin", "thor"])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()

    outcomes = []
    for rate in args.rates:
        for board in args.boards:
            for name in args.cases:
                for repeat in range(args.repeats):
                    with tempfile.TemporaryDirectory() as tmp, JtopService(Path(tmp), board) as svc:
                        outcome = run_case(svc, board, CASES[name], rate_hz=rate)
                    outcomes.append({"rate_hz": rate, "board": board, "case": name, "repeat": repeat,
                                     "exact_mj_per_image": outcome.exact_mj_per_image,
                                     "published_mj_per_image": outcome.published_mj_per_image,
                                     "error": outcome.error, "degraded": bool(outcome.degraded),
                                     "flags": sorted(outcome.reasons), "coverage": outcome.coverage,
                                     "achieved_hz": outcome.achieved_hz, "acceptable": outcome.acceptable})
                    print(json.dumps(outcomes[-1]), flush=True)

    lines = ["| rate | case | board | achieved Hz | worst error, unflagged | worst error, all published | flagged | flags | pass |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rate in args.rates:
        for name in args.cases:
            for board in args.boards:
                group = [o for o in outcomes if o["rate_hz"] == rate and o["case"] == name and o["board"] == board]
                clean = [abs(o["error"]) for o in group if o["error"] is not None and not o["degraded"]]
                published = [o["error"] for o in group if o["error"] is not None]
                worst_all = max(published, key=abs) if published else None
                flags = sorted({f for o in group for f in o["flags"]})
                lines.append(f"| {rate:.0f} Hz | {name} | {board} | "
                             f"{min(o['achieved_hz'] for o in group):.1f}–{max(o['achieved_hz'] for o in group):.1f} | "
                             + (f"{max(clean):.2%}" if clean else "—") + " | "
                             + (f"{worst_all:+.2%}" if worst_all is not None else "none published") + " | "
                             f"{sum(o['degraded'] for o in group)}/{len(group)} | {', '.join(flags) or '—'} | "
                             f"{'yes' if all(o['acceptable'] for o in group) else 'NO'} |")
    table = "\n".join(lines)
    print(table)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"planted-power-{stamp}.json").write_text(json.dumps({"outcomes": outcomes}, indent=1) + "\n")
    (out / f"planted-power-{stamp}.md").write_text(table + "\n")
    return 0 if all(o["acceptable"] for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
