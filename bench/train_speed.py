"""How fast this CPU trains a recipe's teacher, per setting: fp32 or bf16 autocast, NCHW or channels_last, AdamW's
fused kernel or its per-tensor loop, and (``--compile``) torch.compile.

    python bench/train_speed.py --recipe resnet50 --steps 30      # writes bench/results/train-speed-*.{json,md}

Goal, stated before the run: find the setting that trains the teacher fastest on this machine, as a ratio to the
setting EdgeFold used before (fp32, channels_last, AdamW's per-tensor loop) taken in one run with the settings interleaved (a host's slow spell hits each setting alike), so the first
``make edge`` can be cut where the speed-up costs no accuracy (checked apart, by whole runs over seeds: a speed
ratio says nothing of top-1). Each setting times ``--steps`` optimizer steps of the recipe's teacher on its batch size
and input size (random images of the data set's shape: the data path is not what is compared), after
``--warmup`` untimed steps, ``--rounds`` times in turn; the median images/s per setting and its ratio to the setting
before with the min–max over rounds. The machine is recorded (CPU model, vector extensions): bf16 is fast only where the
CPU has AMX or AVX-512-BF16, and emulated (slower) elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.recipe_seeds import machine  # noqa: E402

SETTINGS = (("fp32", True, False, False), ("fp32", False, False, False), ("fp32", True, False, True),
            ("fp32", False, False, True), ("bf16", False, False, True), ("bf16", True, False, True),
            ("fp32", False, True, True), ("bf16", False, True, True))
"""(autocast dtype, channels_last, torch.compile, fused AdamW) of each setting, the one used before first; the
compiled ones only with --compile."""


def name_of(dtype: str, channels_last: bool, compiled: bool, fused: bool) -> str:
    return (f"{dtype} {'channels_last' if channels_last else 'NCHW'} {'fused' if fused else 'foreach'}"
            + (" compiled" if compiled else ""))


def one_round(model, optimizer, batch, labels, dtype: str, channels_last: bool, steps: int, run=None) -> float:
    """Images per second over ``steps`` training steps in one setting (``run``: the compiled model, if any)."""
    import torch

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model.to(memory_format=fmt)
    run = model if run is None else run
    x = batch.contiguous(memory_format=fmt)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
    started = time.perf_counter()
    for _ in range(steps):
        with autocast:
            loss = torch.nn.functional.cross_entropy(run(x), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * len(x) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="resnet50")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--input-size", type=int, help="images of this size instead of the recipe's (e.g. 224)")
    parser.add_argument("--batch-size", type=int, help="instead of the recipe's teacher batch")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd settings (compile time "
                        "reported apart)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from device.models.architectures import build_model
    from pipeline.core.recipe import load_recipe

    recipe, _, _ = load_recipe(args.recipe)
    train = recipe.teacher.train.model_copy(update={"batch_size": args.batch_size or recipe.teacher.train.batch_size})
    size, channels = args.input_size or recipe.preprocess.input_size, recipe.preprocess.channels
    print(f"goal: {__doc__.split('Goal, stated before the run: ')[1].split('. Each')[0]}", flush=True)
    torch.manual_seed(0)
    model = build_model(recipe.teacher.arch, 10, channels).train()
    optimizers = {fused: torch.optim.AdamW(model.parameters(), lr=train.lr, fused=fused) for fused in (False, True)}
    batch = torch.randn(train.batch_size, channels, size, size)
    labels = torch.randint(0, 10, (train.batch_size,))
    settings = [s for s in SETTINGS if args.compile or not s[2]]
    rates: dict[str, list[float]] = {name_of(*s): [] for s in settings}
    compiled, compile_s = {}, {}
    for setting in settings:  # each setting's kernels chosen (and compiled) before anything is timed
        dtype, channels_last, compile_it, fused = setting
        if compile_it:
            compiled[setting] = torch.compile(model)
            started = time.perf_counter()
            one_round(model, optimizers[fused], batch, labels, dtype, channels_last, 1, compiled[setting])
            compile_s[name_of(*setting)] = round(time.perf_counter() - started, 1)
        one_round(model, optimizers[fused], batch, labels, dtype, channels_last, args.warmup, compiled.get(setting))
    for index in range(args.rounds):
        for setting, name in zip(settings, rates):
            rates[name].append(one_round(model, optimizers[setting[3]], batch, labels, *setting[:2], args.steps,
                                         compiled.get(setting)))
            print(f"round {index + 1}/{args.rounds} {name}: {rates[name][-1]:.1f} images/s", flush=True)
    base = np.median(rates[name_of(*SETTINGS[0])])
    rows = [{"setting": name, "images_per_s": float(np.median(r)), "ratio": float(np.median(r) / base),
             "compile_s": compile_s.get(name),
             "ratio_min": float(min(r) / base), "ratio_max": float(max(r) / base), "rounds": r}
            for name, r in rates.items()]
    host = machine()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    document = {"goal": __doc__.split("Goal, stated before the run: ")[1].split("\n\n")[0].replace("\n", " "),
                "recipe": args.recipe, "arch": recipe.teacher.arch, "batch_size": train.batch_size,
                "input": [channels, size, size], "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                "torch": torch.__version__, "threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default (unset)", "machine": host,
                "settings": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"train-speed-{args.recipe}-{size}px-{stamp}" if args.input_size else f"train-speed-{args.recipe}-{stamp}"
    (args.out / f"{stem}.json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [f"## Teacher training speed: {args.recipe} ({recipe.teacher.arch}, batch {train.batch_size}, "
             f"{channels}×{size}×{size}), {time.strftime('%Y-%m-%d')}", "",
             f"Goal, stated before the run: {document['goal']}", "",
             f"Machine: {host['cpu']}, {host['cores']} cores, {host['kernels']} ({', '.join(host['vector_flags'])}); "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY "
             f"{document['omp_wait_policy']}. {args.rounds} rounds × {args.steps} "
             "steps per setting, interleaved.", "",
             "| setting | images/s (median) | × before | min–max over rounds | every round | first step s |",
             "|---|---:|---:|---|---|---:|"]
    for row in rows:
        lines.append(f"| {row['setting']} | {row['images_per_s']:.1f} | {row['ratio']:.2f} | "
                     f"{row['ratio_min']:.2f}–{row['ratio_max']:.2f} | {', '.join(f'{v:.1f}' for v in row['rounds'])} | "
                     f"{row['compile_s'] if row['compile_s'] is not None else ''} |")
    text = "\n".join(lines) + "\n"
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
