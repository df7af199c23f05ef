"""Writes every generated part of the README from the files that recorded it, so no figure or console output there is
typed by hand, and checks the README's rules.

    python bench/readme_figures.py                # rewrites the README's generated blocks from the recorded files
    python bench/readme_figures.py --check        # exit 1 when a block is not what the files say, or a rule fails
    python bench/readme_figures.py --examples --screenshot --install-time   # run them again first (make readme-figures)

The blocks: the figures (the newest ``bench/results/seeds-<recipe>-*.json`` per recipe and kernels: seeds passing
every gate, each figure's mean and 95% interval over the seeds, the data set and the machine), the compatibility table
(``device/l4t.json``), the console examples (``bench/results/readme/<name>.txt``, each the output of a short command
run by ``--examples``, this machine's paths replaced by relative ones) and the install time. The rules: at most
:data:`MAX_LINES` lines, no path of a machine, and every paragraph that speaks of a Jetson, Orin, Thor, TensorRT, a
GPU or DLA in the README or ``device/README.md`` says where that was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
README = REPO / "README.md"
MODELS = REPO / "models"
L4T_TABLE = REPO / "device" / "l4t.json"
RECORDED = HERE / "results" / "readme"
BEGIN, END = "<!-- figures:begin (bench/readme_figures.py) -->", "<!-- figures:end -->"
MAX_LINES = 300
DEVICE_WORDS = re.compile(r"\b(Jetson|Orin|Thor|TensorRT|GPU|DLA)\b")
# How a paragraph says where what it claims was measured (or that it was not, or that it is NVIDIA's word).
PLACES = ("measured on", "measured here", "not yet measured", "not yet been measured", "stand-in", "simulated",
          "nvidia's documented", "documented by nvidia", "per nvidia's", "no board has", "not a jetson's")
MACHINE_PATH = re.compile(r"(/tmp/|/work/|/home/\w|/root/|/Users/|\.venv/lib/|site-packages/)")
# The console examples, each one or more steps: (the command shown, the command run); {runs}, {tmp} and {python} are
# placeholders. A step whose shown command is None prepares and is not shown.
EXAMPLES: dict[str, list[tuple[str | None, list[str]]]] = {
    "tiny": [("make edge MODEL=tiny", ["make", "-s", "edge", "MODEL=tiny", "RUNS={runs}"])],
    "onnx-start": [("make edge MODEL=student.onnx DATA=digits SET='preprocess.mean=[0.3,0.3,0.3] "
                    "preprocess.std=[0.38,0.38,0.38]'",
                    ["make", "-s", "edge", "MODEL={tmp}/student.onnx", "DATA=digits", "RUNS={runs}",
                     "SET=preprocess.mean=[0.3,0.3,0.3] preprocess.std=[0.38,0.38,0.38]"])],
    "recipe-error": [("edgefold run tiny --set prune.macs_targt=0.3",
                      ["{python}", "-m", "pipeline", "run", "tiny", "--set", "prune.macs_targt=0.3", "--runs-dir",
                       "{runs}"])],
    "recipes-check": [("edgefold recipes --check", ["{python}", "-m", "pipeline", "recipes", "--check"])],
    "timm": [("make edge MODEL=tiny DATA=digits SET='teacher.arch=timm/test_convnext preprocess=null'",
              ["make", "-s", "edge", "MODEL=tiny", "DATA=digits", "RUNS={runs}",
               "SET=teacher.arch=timm/test_convnext preprocess=null"])],
    "shufflenet": [("python -m tests.onnx_models shufflenet.onnx",
                    ["{python}", "-m", "tests.onnx_models", "{tmp}/shufflenet.onnx"]),
                   ("make edge MODEL=shufflenet.onnx DATA=digits SET='preprocess.mean=[0.3,0.3,0.3] "
                    "preprocess.std=[0.38,0.38,0.38]'",
                    ["make", "-s", "edge", "MODEL={tmp}/shufflenet.onnx", "DATA=digits", "RUNS={runs}",
                     "SET=preprocess.mean=[0.3,0.3,0.3] preprocess.std=[0.38,0.38,0.38]"]),
                   ("make edge MODEL=shufflenet.onnx DATA=fashion-mnist",
                    ["make", "-s", "edge", "MODEL={tmp}/shufflenet.onnx", "DATA=fashion-mnist", "RUNS={runs}"])],
    "frame": [("make edge MODEL=tiny SET='deploy.frame.width=1280 deploy.frame.height=720 deploy.frame.format=jpeg "
               "deploy.frame.source=images'",
               ["make", "-s", "edge", "MODEL=tiny", "RUNS={runs}", "RUN=frame", "SET=deploy.frame.width=1280 "
                "deploy.frame.height=720 deploy.frame.format=jpeg deploy.frame.source=images"])],
}
# The documents whose blocks are generated (the README's rules apply to the README and device/README.md).
DOCUMENTS = (README, REPO / "pipeline" / "README.md")


# -- the figures ------------------------------------------------------------------------------------------------------
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


def data_set(doc: dict) -> str:
    """The data set a seeds file ran on: its own record (files from 2026-12-04 on), else its recipe's."""
    recorded = (doc.get("provenance") or {}).get("data")
    if recorded:
        return recorded
    import yaml

    recipe = MODELS / f"{doc['recipe']}.yaml"
    if recipe.is_file():
        raw = yaml.safe_load(recipe.read_text())
        size = (raw.get("preprocess") or raw.get("teacher") or {}).get("input_size")
        return f"{raw['data']['source']}" + (f" at {size} px" if size else "")
    if doc["recipe"].startswith("byom-"):  # bench/byom_timm.py's own recipe, written at run time
        sys.path.insert(0, str(HERE))
        import byom_timm

        return byom_timm.DATA_NAME
    return ""  # the rules then refuse the row


def block(docs: dict[tuple[str, str], dict]) -> str:
    def figure(f: dict | None) -> str:
        def shown(value: float) -> str:
            return f"{round(value, 2) + 0.0:.2f}"  # + 0.0: a rounded -0.0 is shown as 0.00

        if not f:
            return "—"
        if f["low"] != f["low"]:  # NaN: one seed has no interval over seeds
            return f"{shown(f['mean'])} (one seed)"
        return f"{shown(f['mean'])} [{shown(f['low'])}, {shown(f['high'])}]"

    lines = [BEGIN, "| recipe | data | seeds passing every gate | teacher | student | INT8 | INT8 − student, points | "
                    "build seconds per run (data to evaluate) | machine | file |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (recipe, _), doc in docs.items():
        s, m = doc["summary"], doc["machine"]
        drop = s.get("int8_drop_points")
        change = None if not drop else {"mean": -drop["mean"], "low": -drop["high"], "high": -drop["low"]}
        lines.append(f"| {recipe} | {data_set(doc)} | {s['passed']} of {s['seeds']} | {figure(s.get('teacher'))} | "
                     f"{figure(s.get('student'))} | {figure(s.get('INT8'))} | {figure(change)} | "
                     f"{figure(s.get('build_seconds'))} | {m['cpu']}, {m['cores']} cores, {m['kernels']} | "
                     f"[{Path(doc['file']).name}]({doc['file']}) |")
    lines.append(END)
    return "\n".join(lines)


# -- the other blocks -------------------------------------------------------------------------------------------------
def compatibility() -> str:
    """One row per L4T family of ``device/l4t.json``."""
    families = json.loads(L4T_TABLE.read_text())["families"]
    lines = ["| L4T | JetPack | CUDA | TensorRT | the agent's Python | engines built by the agent | agent image |",
             "|---|---|---|---|---|---|---|"]
    for key, f in sorted(families.items(), key=lambda item: tuple(int(p) for p in item[0].split("."))):
        engines = "yes" if f.get("tensorrt_in_agent") else "no: ONNX Runtime"
        image = f"`{f['base']}`" if f.get("base") else "none (make agent, or make bundle)"
        lines.append(f"| {key} | {f['jetpack']} | {f['cuda']} | {f['tensorrt']} | {f['agent_python']} | {engines} | "
                     f"{image} |")
    return "\n".join(lines)


# The lines of each example's output a document shows (the rest is elided with one "…"); the whole output is in
# bench/results/readme/<name>.txt. A step's "$ command" line is always shown.
SHOWN = {
    "tiny": re.compile(r"^(run |\[\s*\w+\] done|rung |-{20}|(teacher|pruned|student\w*)\s{2,}\d|report: |"
                       r"student FP32 on|  top-1 |  latency p50)"),
    "onnx-start": re.compile(r"^(run |export: |\[(  export|quantize|  deploy)\] done|  top-1 |report: )"),
    "recipe-error": re.compile(r""),
    "recipes-check": re.compile(r"^(\S+\s+ok|architectures|  (efficientnet_b0|tiny_resnet|timm/))"),
    "timm": re.compile(r"^(run |preprocess from|\[\s*\w+\] done|rung |-{20}|(teacher|pruned|student\w*)\s{2,}\d)"),
    "shufflenet": re.compile(r"^(export: |\[(  export|quantize)\] done|rung |-{20}|student\w*\s{2,}\d|student \w+ on |"
                             r"  top-1 |  latency p50|error: |  fix: )"),
    "frame": re.compile(r"^  frame "),
}


def shown(name: str, text: str) -> str:
    """The example's lines a document shows, each elided run of others as one "…"."""
    lines, elided = [], False
    for line in text.rstrip("\n").splitlines():
        if line.startswith("$ ") or SHOWN[name].match(line):
            lines.append(line)
            elided = False
        elif not elided:
            lines.append("…")
            elided = True
    return "\n".join(lines)


def example(name: str) -> str:
    return f"```\n{shown(name, (RECORDED / f'{name}.txt').read_text())}\n```"


def install_time() -> str:
    record = json.loads((RECORDED / "install.json").read_text())
    return (f"Installing took {record['seconds']:.0f} s on {record['machine']}, with the packages already in pip's "
            f"cache, and the environment takes {record['venv_gb']:.1f} GB of disk ({record['date']}; a first install "
            "also downloads them).")


def first_run(results: Path | None = None) -> str:
    """The main job's first-run time, from the newest ``make bench`` result file (``bench/results/resnet50-*.json``)."""
    files = sorted((results or HERE / "results").glob("resnet50-2*.json"))
    doc = json.loads(files[-1].read_text())
    m = doc["machine"]
    return (f"Its first run took {doc['first_run_s'] / 60:.1f} minutes and a cached re-run {doc['cached_rerun_s']:.1f} s, "
            f"measured on a {m['cores']}-core {m['machine']} CPU ({m['cpu']}, {m['kernels']}) on {doc['date'][:10]} "
            f"by `make bench` ([{files[-1].stem}.md](bench/results/{files[-1].stem}.md)).")


def blocks() -> dict[str, object]:
    """Every generated block by its marker name (each made only when the text has its markers)."""
    out: dict[str, object] = {f"example:{name}": (lambda name=name: example(name)) for name in EXAMPLES}
    out["compatibility"] = compatibility
    out["install-time"] = install_time
    out["first-run"] = first_run
    return out


def render(text: str, results: Path) -> str:
    """``text`` with every block rewritten (a block absent from it is left absent)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block(newest_by_recipe(results)) + tail
    for name, content in blocks().items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = f"{head}{begin}\n{content()}\n{end}{tail}"
    return text


# -- the rules --------------------------------------------------------------------------------------------------------
def paragraphs(text: str) -> list[str]:
    """Prose paragraphs (code blocks and tables left out: a command line is no claim)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.lstrip().startswith(("|", "<!--", "#"))]


def rule_problems(readme: Path) -> list[str]:
    text = readme.read_text()
    problems = []
    lines = len(text.splitlines())  # as wc -l counts them
    if readme.name == "README.md" and readme.parent == REPO and lines > MAX_LINES:
        problems.append(f"{readme}: {lines} lines, over {MAX_LINES}")
    for found in MACHINE_PATH.finditer(re.sub(r"<!--.*?-->", "", text)):
        problems.append(f"{readme}: a machine's path {found.group(0)!r} near {text[found.start():found.start() + 60]!r}")
    for documents in (readme, readme.parent / "device" / "README.md"):
        if not documents.is_file():
            continue
        for paragraph in paragraphs(documents.read_text()):
            if DEVICE_WORDS.search(paragraph) and not any(place in paragraph.lower() for place in PLACES):
                problems.append(f"{documents.name}: a paragraph speaks of {DEVICE_WORDS.search(paragraph).group(0)} "
                                f"without saying where it was measured: {paragraph.strip()[:120]!r}")
    figures = text.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in text and END in text else ""
    for row in figures.splitlines()[3:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) < 10 or not cells[1]:
            problems.append(f"{readme}: a figures row without its data set: {row[:80]!r}")
    return problems


# -- running the examples again ---------------------------------------------------------------------------------------
def normalized(output: str, runs: Path) -> str:
    """This machine's paths made the README's: the runs folder as ``runs``, its folder and the repository as ``.``."""
    text = output.replace(str(runs), "runs").replace(str(runs.parent) + "/", "").replace(str(runs.parent), ".")
    text = text.replace(str(REPO) + "/", "").replace(str(REPO), ".")
    text = text.replace(sys.executable, "python").replace(str(Path(sys.prefix)), ".venv")
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text).rstrip() + "\n"


def run_examples(picture: bool) -> None:
    """Runs each example in a fresh runs folder and records its output (what the documents show); ``picture``: takes
    the tiny report's picture too."""
    RECORDED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        for name, steps in EXAMPLES.items():
            if name == "onnx-start":  # the tiny run's own student, as a user's trained file
                Path(tmp, "student.onnx").write_bytes((runs / "tiny" / "latest" / "export" / "student.onnx").read_bytes())
            recorded = []
            for shown_command, command in steps:
                argv = [part.replace("{runs}", str(runs)).replace("{tmp}", tmp).replace("{python}", sys.executable)
                        for part in command]
                # One stream, as a terminal shows it: the stage lines (stderr) before the report (stdout).
                result = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        timeout=1800, env={**os.environ, "EDGEFOLD_PROGRESS": "0"})
                recorded.append(f"$ {shown_command}\n{normalized(result.stdout, runs).rstrip()}")
                print(f"recorded {name}: {shown_command} (exit {result.returncode})")
            (RECORDED / f"{name}.txt").write_text("\n".join(recorded) + "\n")
            if name == "tiny" and picture:
                screenshot(runs / "tiny" / "latest" / "report" / "report.html")


def screenshot(report: Path, size: str = "1366,900") -> None:
    """A picture of the report's top (its headline and ladder) with headless Chromium."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: the picture needs Chromium: apt-get install chromium")
    target = RECORDED / "report-tiny.png"
    # The page with this machine's paths made relative, as the console examples are; beside the report, so its
    # relative links still resolve.
    shown = report.with_name("readme-picture.html")
    shown.write_text(normalized(report.read_text(), report.parents[3]))
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={size}", f"--screenshot={target}", shown.as_uri()],
                   check=True, capture_output=True, timeout=120)
    shown.unlink()
    print(f"wrote {target}")


def measure_install() -> None:
    """Times ``pip install -e .[extras] -c constraints.txt`` into a fresh venv (pip's cache as it is)."""
    import platform

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "venv", f"{tmp}/venv"], check=True)
        started = time.monotonic()
        subprocess.run([f"{tmp}/venv/bin/python", "-m", "pip", "install", "--quiet", "-e",
                        ".[build,device,modelopt,nvml,dev]", "-c", "constraints.txt"], cwd=REPO, check=True)
        seconds = time.monotonic() - started
        size = sum(f.stat().st_size for f in Path(tmp, "venv").rglob("*") if f.is_file()) / 1e9
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    record = {"seconds": round(seconds, 1), "machine": f"a {os.cpu_count()}-core {platform.machine()} CPU ({cpu})",
              "date": time.strftime("%Y-%m-%d"), "venv_gb": round(size, 1)}
    RECORDED.mkdir(parents=True, exist_ok=True)
    (RECORDED / "install.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"install: {record}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare and check the rules; exit 1 on a problem")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--examples", action="store_true", help="run the console examples again first (minutes)")
    parser.add_argument("--screenshot", action="store_true", help="with --examples: take the report's picture again")
    parser.add_argument("--install-time", action="store_true", help="time an install into a fresh venv first")
    args = parser.parse_args(argv)
    if args.install_time:
        measure_install()
    if args.screenshot and not args.examples:
        parser.error("--screenshot takes the picture of the report --examples makes: pass both")
    if args.examples:
        run_examples(args.screenshot)
    text = args.readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"error: {args.readme} has no figures block ({BEGIN} … {END})", file=sys.stderr)
        return 2
    updated = render(text, args.results)
    # The reference pages' console blocks too, when the README is the project's own (a test's copy stands alone).
    others = {path: path.read_text() for path in DOCUMENTS[1:]} if args.readme.resolve() == README else {}
    if args.check:
        problems = rule_problems(args.readme)
        stale = [path for path, old in [(args.readme, text), *others.items()]
                 if (updated if path == args.readme else render(old, args.results)) != old]
        for path in stale:
            problems.insert(0, f"{path}: a generated block is not what the recorded files say; run make readme-figures")
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    args.readme.write_text(updated)
    for path, old in others.items():
        path.write_text(render(old, args.results))
    print(f"wrote the generated blocks of {', '.join(str(p) for p in [args.readme, *others])}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
