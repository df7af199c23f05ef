"""How long the test suite takes, measured rather than guessed (#62).

    python bench/suite_time.py --runs 3            # make test, three times (about an hour on two cores)
    python bench/suite_time.py --runs 3 --fast     # make test-fast, the inner loop
    python bench/suite_time.py --parse LOG ...     # a record from logs of runs already made (pytest -q --durations=0)

Goal, stated before the run (#62): ``make test`` takes at most 10 minutes of pytest on a clean clone of this kind of
machine (two cores), with nothing else running. Each run is ``make test`` (or ``test-fast``) with
``--durations=0``; the record keeps every run's pytest wall time and counts, their median and spread, the machine,
the commit, and, from the median run, the slowest files (their tests' call, setup and teardown times summed: what
each file costs a worker) and the ten slowest tests. Nothing is tuned here: the figures are what the suite costs.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

GOAL = "make test takes at most 10 minutes of pytest on a clean clone here, nothing else running (#62)"
GOAL_S = 600.0
# pytest's last line: "=== 941 passed, 7 skipped in 120.47s (0:02:00) ===", or without the rules under -q.
_SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s\b", re.M)
_COUNT = re.compile(r"(?P<n>\d+) (?P<kind>passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
_DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?P<phase>call|setup|teardown)\s+(?P<test>\S+)$")
# make's echo of the pytest command line: "… -m pytest -n 3 --dist loadfile …" (no -n: one process).
SLOWEST = 20  # test phases kept per record, each with what it guards
_WORKERS = re.compile(r"-m pytest\b.*?\s-n\s+(?P<n>\d+)")


def parse_log(text: str) -> dict[str, Any]:
    """One pytest run's figures from its output (``-q --durations=0``).

    Returns:
        ``seconds`` (pytest's own wall time), ``counts`` by outcome, ``workers`` (pytest-xdist's, from make's echo of
        the command; None where the log does not show it), ``files`` (seconds per test file, summed over
        its tests' phases, largest first) and ``slowest`` (the :data:`SLOWEST` slowest test phases).

    Raises:
        ValueError: The output has no pytest summary line (the run did not finish).
    """
    summaries = list(_SUMMARY.finditer(text))
    if not summaries:
        raise ValueError("no pytest summary line ('=== N passed … in S s ===') in the output: the run did not finish")
    last = summaries[-1]
    counts = {match["kind"].rstrip("s") if match["kind"].startswith("error") else match["kind"]: int(match["n"])
              for match in _COUNT.finditer(last["counts"])}
    files: dict[str, float] = defaultdict(float)
    phases = []
    for line in text.splitlines():
        match = _DURATION.match(line.strip())
        if match:
            seconds = float(match["seconds"])
            files[match["test"].split("::")[0]] += seconds
            phases.append({"seconds": seconds, "phase": match["phase"], "test": match["test"]})
    workers = _WORKERS.search(text)
    return {"seconds": float(last["seconds"]), "counts": counts, "workers": int(workers["n"]) if workers else None,
            "files": dict(sorted(files.items(), key=lambda item: -item[1])),
            "slowest": sorted(phases, key=lambda p: -p["seconds"])[:SLOWEST]}


def guards(test: str, repo: Path = REPO) -> str:
    """What a test guards, in its own words: its docstring's first sentence, else its name read as a sentence
    (``tests/a.py::test_resume_gives_the_same_model[x]`` → "resume gives the same model"); a fixture's setup is
    charged to the first test that asked for it."""
    import ast

    path, _, name = test.partition("::")
    name = name.split("[")[0].split("::")[-1]
    try:
        tree = ast.parse((repo / path).read_text())
    except (OSError, SyntaxError):
        return name.removeprefix("test_").replace("_", " ")
    function = next((node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.name == name), None)
    doc = ast.get_docstring(function) if function is not None else None
    if not doc:
        return name.removeprefix("test_").replace("_", " ")
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".") + "."


def summarize(runs: list[dict[str, Any]], target: str, machine: dict[str, Any], commit: str | None) -> dict[str, Any]:
    """Every run, the median and spread of their times, and the median run's profile."""
    times = [run["seconds"] for run in runs]
    median_run = sorted(runs, key=lambda run: run["seconds"])[(len(runs) - 1) // 2]
    return {"goal": GOAL if target == "test" else f"(the inner loop, reported beside the goal) {GOAL}",
            "target": f"make {target}", "machine": machine, "commit": commit, "date": time.strftime("%Y-%m-%d"),
            "runs": [{key: run.get(key) for key in ("seconds", "counts", "workers")} for run in runs],
            "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "goal_met": target == "test" and max(times) <= GOAL_S,
            "files": median_run["files"], "slowest": median_run["slowest"]}


def markdown(record: dict[str, Any]) -> str:
    machine = record["machine"]
    lines = [f"## Suite time: {record['target']}", "", f"Goal, stated before the run: {record['goal']}.", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['kernels']} kernels; commit "
             f"{record['commit']}; {record['date']}.", "",
             f"**Median {record['median_s'] / 60:.1f} min** of pytest over {len(record['runs'])} run(s) "
             f"(min {record['min_s'] / 60:.1f}, max {record['max_s'] / 60:.1f}); "
             + ("goal met." if record["goal_met"] else "goal NOT met." if record["target"] == "make test"
                else "the goal is the whole suite's."), "", "| run | pytest s | workers | tests |", "|---|---|---|---|"]
    for index, run in enumerate(record["runs"], 1):
        counts = ", ".join(f"{n} {kind}" for kind, n in run["counts"].items())
        lines.append(f"| {index} | {run['seconds']:.0f} | {run.get('workers') or '—'} | {counts} |")
    lines += ["", "The slowest files of the median run (seconds of their tests' phases, on whichever worker ran them):",
              "", "| file | s |", "|---|---|"]
    lines += [f"| {name} | {seconds:.0f} |" for name, seconds in list(record["files"].items())[:15]]
    lines += ["", "The slowest test phases, each with what it guards (its docstring's first sentence, or its name; a "
              "setup phase is a fixture's, charged to the first test that asked for it):", "",
              "| s | phase | test | what it guards |", "|---|---|---|---|"]
    lines += [f"| {p['seconds']:.1f} | {p['phase']} | {p['test']} | {guards(p['test']).replace('|', '/')} |"
              for p in record["slowest"]]
    return "\n".join(lines) + "\n"


def run_suite(target: str) -> str:
    """One ``make test`` (or ``test-fast``) with every duration; its output (it fails loudly when pytest does)."""
    done = subprocess.run(["make", target, "PYTEST_ARGS=-q --durations=0 -p no:cacheprovider"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"make {target} failed (exit {done.returncode}); its end:\n{done.stdout[-3000:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="how many times to run the suite (default 3)")
    parser.add_argument("--fast", action="store_true", help="make test-fast instead of make test")
    parser.add_argument("--parse", nargs="+", type=Path, metavar="LOG",
                        help="record these finished runs' outputs instead of running the suite")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgefold-suite-time"),
                        help="where each run's output is kept (for --parse later)")
    args = parser.parse_args(argv)
    from recipe_seeds import machine

    target = "test-fast" if args.fast else "test"
    print(f"goal: {GOAL}", flush=True)
    outputs = [path.read_text() for path in args.parse] if args.parse else []
    args.work.mkdir(parents=True, exist_ok=True)
    for index in range(0 if args.parse else args.runs):
        started = time.monotonic()
        outputs.append(run_suite(target))
        kept = args.work / f"{target}-run{index + 1}.log"  # kept before it is read: a parse error loses no run
        kept.write_text(outputs[-1])
        print(f"run {index + 1}/{args.runs}: {time.monotonic() - started:.0f} s ({kept})", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or None
    record = summarize([parse_log(text) for text in outputs], target, machine(), commit)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"suite-time-{target}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(record))
    print(markdown(record))
    print(f"written: {stem}.json, {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
