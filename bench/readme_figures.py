"""Writes the README's figures from the result files that recorded them, so no number there is typed by hand.

    python bench/readme_figures.py            # rewrites the block between the README's figures markers
    python bench/readme_figures.py --check    # exit 1 when the README's block is not what the files say

The block lists, per recipe, the newest ``bench/results/seeds-<recipe>-*.json`` (bench/recipe_seeds.py): how many
seeds passed every gate, each figure's mean and 95% interval over the seeds, and the machine that measured them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
BEGIN, END = "<!-- figures:begin (bench/readme_figures.py) -->", "<!-- figures:end -->"


def newest_by_recipe(results: Path) -> dict[tuple[str, str], dict]:
    """The newest result per recipe and kernels (a run with PyTorch's kernels forced lower is a row of its own)."""
    newest: dict[tuple[str, str], tuple[str, dict]] = {}
    for path in sorted(results.glob("seeds-*.json")):
        doc = json.loads(path.read_text())
        if doc.get("schema") != "edgefold.bench.seeds/1":
            continue
        key = (doc["recipe"], doc["machine"]["kernels"])
        if key not in newest or path.name > newest[key][0]:
            newest[key] = (path.name, {**doc, "file": f"bench/results/{path.name}"})
    return {key: doc for key, (_, doc) in sorted(newest.items())}


def block(docs: dict[tuple[str, str], dict]) -> str:
    def figure(f: dict | None) -> str:
        def shown(value: float) -> str:
            return f"{round(value, 2) + 0.0:.2f}"  # + 0.0: a rounded -0.0 is shown as 0.00

        return "—" if not f else f"{shown(f['mean'])} [{shown(f['low'])}, {shown(f['high'])}]"

    lines = [BEGIN, "| recipe | seeds passing every gate | teacher | student | INT8 | INT8 − student, points | "
                    "build seconds per run (data to evaluate) | machine | file |", "|---|---|---|---|---|---|---|---|---|"]
    for (recipe, _), doc in docs.items():
        s, m = doc["summary"], doc["machine"]
        drop = s.get("int8_drop_points")
        change = None if not drop else {"mean": -drop["mean"], "low": -drop["high"], "high": -drop["low"]}
        lines.append(f"| {recipe} | {s['passed']} of {s['seeds']} | {figure(s.get('teacher'))} | "
                     f"{figure(s.get('student'))} | {figure(s.get('INT8'))} | {figure(change)} | "
                     f"{figure(s.get('build_seconds'))} | {m['cpu']}, {m['cores']} cores, {m['kernels']} | "
                     f"[{Path(doc['file']).name}]({doc['file']}) |")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the README differs")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"error: {args.readme} has no figures block ({BEGIN} … {END})", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    updated = head + block(newest_by_recipe(args.results)) + tail
    if args.check:
        if updated != text:
            print(f"{args.readme}: the figures block is not what {args.results} says; run make readme-figures")
            return 1
        return 0
    args.readme.write_text(updated)
    print(f"wrote the figures block of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
