"""A YOLOv8 trained by Ultralytics itself, started as its own ONNX export, through the INT8 ladder, over seeds.

    python bench/yolo_start.py --work DIR                  # 3 seeds; resumable
    python bench/yolo_start.py --work DIR --seeds 0 1 2 --epochs 10

The model users bring most often: YOLOv8n built from ``yolov8n.yaml`` (no pretrained weights can be fetched here)
and trained by Ultralytics 8.4 (installed by this script with ``pip install --no-deps`` into ``DIR/ultralytics``,
kept out of EdgeFold's dependencies and lock: AGPL-3.0) for 10 epochs at 128 px on a small real-photo set, then
exported as its users export it (``export(format="onnx", dynamic=True)``) and handed to EdgeFold as
``MODEL=best.onnx DATA=coco:…``.

The photo set is cut from scikit-image's sample photographs (shipped with the package, real photos): objects —
the cat (``chelsea``), the coffee cup (``coffee``), the astronaut, the rocket — pasted at random sizes and places on
crops of other photographs (the Hubble deep field, the retina, a stained tissue, brick, grass, gravel), 160×120 px
(4:3, so letterboxing is exercised), each object's box exact. Ultralytics trains on 281 images and validates on 70
(its own split); EdgeFold gets another 1,000 images from the same generator that Ultralytics never saw, of which it
draws its test split (200) and its calibration images. Seed *s* drives Ultralytics' training only; the photo sets
and EdgeFold's recipe are the same at every seed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BUDGET_POINTS = 1.0
GOAL = (
    "Goal, stated before the runs: at every seed, EdgeFold takes the ONNX file Ultralytics exported "
    "(dynamic=True) without a change by hand, and its INT8 rung is within 1.0 mAP point of the FP32 export on "
    "EdgeFold's 200 held-out test images: the quantize gate passes, and the paired 95% interval of INT8 - FP32 "
    "(bootstrap over the test images) has its lower bound >= -1.0 point. Reported beside it, not part of the goal: "
    "which step of the ladder passed, each plain calibration's change, and the mixed step's choice against the best "
    "plain rung.")
CLASSES = ("cat", "cup", "astronaut", "rocket")
ULTRALYTICS = ["ultralytics>=8.4,<8.5", "ultralytics-thop", "polars", "polars-runtime-32", "py-cpuinfo"]


def _objects() -> dict[str, np.ndarray]:
    """Each class's source photograph cut to the object (RGB uint8)."""
    import skimage.data as photos

    return {"cat": photos.chelsea()[10:300, 80:360], "cup": photos.coffee()[30:370, 120:490],
            "astronaut": photos.astronaut()[0:300, 120:380], "rocket": photos.rocket()[0:427, 240:400]}


def _backgrounds() -> list[np.ndarray]:
    import skimage.data as photos

    grey = [photos.brick(), photos.grass(), photos.gravel(), photos.moon()]
    return [photos.hubble_deep_field(), photos.retina(), photos.immunohistochemistry(),
            *[np.repeat(g[..., None], 3, axis=2) for g in grey]]


def photo_set(folder: Path, count: int, seed: int, width: int = 160, height: int = 120) -> Path:
    """``count`` photos with 1–3 pasted objects each, written as JPEGs with COCO annotations
    (``annotations.json``) and Ultralytics' labels (``labels/*.txt``: class cx cy w h, normalised). Returns the
    COCO file."""
    import cv2

    rng = np.random.default_rng(seed)
    objects, backgrounds = _objects(), _backgrounds()
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "labels").mkdir(exist_ok=True)
    coco = {"images": [], "annotations": [],
            "categories": [{"id": k + 1, "name": name} for k, name in enumerate(CLASSES)]}
    for index in range(count):
        source = backgrounds[rng.integers(len(backgrounds))]
        scale = rng.uniform(0.3, 1.0)
        h, w = int(source.shape[0] * scale), int(source.shape[1] * scale)
        y, x = rng.integers(0, source.shape[0] - h + 1), rng.integers(0, source.shape[1] - w + 1)
        canvas = cv2.resize(np.ascontiguousarray(source[y:y + h, x:x + w]), (width, height),
                            interpolation=cv2.INTER_AREA)
        placed: list[list[float]] = []
        for _ in range(rng.integers(1, 4)):
            label = int(rng.integers(len(CLASSES)))
            patch = objects[CLASSES[label]]
            side = rng.uniform(0.25, 0.6) * height
            aspect = patch.shape[1] / patch.shape[0] * rng.uniform(0.85, 1.15)
            ph, pw = int(side), int(min(side * aspect, 0.9 * width))
            for _ in range(20):  # a place that overlaps the others little
                top, left = int(rng.integers(0, height - ph + 1)), int(rng.integers(0, width - pw + 1))
                box = [left, top, left + pw, top + ph]
                if all(_iou(box, other) < 0.2 for other in placed):
                    break
            else:
                continue
            resized = cv2.resize(patch, (pw, ph), interpolation=cv2.INTER_AREA)
            if rng.random() < 0.5:
                resized = resized[:, ::-1]
            canvas[top:top + ph, left:left + pw] = np.clip(resized * rng.uniform(0.8, 1.2), 0, 255).astype(np.uint8)
            placed.append(box)
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": index + 1,
                                        "category_id": label + 1, "bbox": [left, top, pw, ph], "area": pw * ph,
                                        "iscrowd": 0, "class": label})
        name = f"{index:05d}.jpg"
        cv2.imwrite(str(folder / "images" / name), cv2.cvtColor(canvas, cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        coco["images"].append({"id": index + 1, "file_name": name, "width": width, "height": height})
        lines = [f"{a['class']} {(a['bbox'][0] + a['bbox'][2] / 2) / width:.6f} "
                 f"{(a['bbox'][1] + a['bbox'][3] / 2) / height:.6f} {a['bbox'][2] / width:.6f} "
                 f"{a['bbox'][3] / height:.6f}" for a in coco["annotations"] if a["image_id"] == index + 1]
        (folder / "labels" / name.replace(".jpg", ".txt")).write_text("\n".join(lines) + ("\n" if lines else ""))
    for annotation in coco["annotations"]:
        del annotation["class"]
    (folder / "annotations.json").write_text(json.dumps(coco))
    return folder / "annotations.json"


def _iou(a: list[float], b: list[float]) -> float:
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def _ultralytics(work: Path) -> Path:
    """Ultralytics installed into ``work/ultralytics`` (once), beside this environment's torch."""
    target = work / "ultralytics"
    if not (target / "ultralytics").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        *ULTRALYTICS], check=True)
    return target


def _train_and_export(work: Path, seed: int, epochs: int, size: int) -> tuple[Path, dict[str, Any]]:
    """YOLOv8n trained by Ultralytics on the training photos at ``seed``, exported with ``dynamic=True``."""
    run = work / f"yolo-seed{seed}"
    onnx = run / "weights" / "best.onnx"
    facts_path = run / "edgefold-bench.json"
    if onnx.is_file() and facts_path.is_file():
        return onnx, json.loads(facts_path.read_text())
    data = work / "yolo-data.yaml"
    data.write_text(f"path: {work / 'photos'}\ntrain: train/images\nval: val/images\n"
                    f"names: {dict(enumerate(CLASSES))}\n")
    script = f"""
import json, time
from ultralytics import YOLO, __version__
model = YOLO("yolov8n.yaml")
began = time.time()
results = model.train(data={str(data)!r}, epochs={epochs}, imgsz={size}, batch=16, seed={seed}, deterministic=True,
                      workers=0, plots=False, device="cpu", project={str(work)!r}, name="yolo-seed{seed}",
                      exist_ok=True, amp=False, verbose=False)
trained = time.time() - began
best = YOLO({str(run / 'weights' / 'best.pt')!r})
path = best.export(format="onnx", dynamic=True, imgsz={size})
metrics = best.val(data={str(data)!r}, imgsz={size}, batch=16, device="cpu", plots=False, verbose=False)
print(json.dumps({{"ultralytics": __version__, "train_s": trained, "onnx": path,
                  "val_map50_95": float(metrics.box.map), "val_map50": float(metrics.box.map50)}}))
"""
    env = {**os.environ, "PYTHONPATH": str(_ultralytics(work)), "YOLO_OFFLINE": "1",
           "YOLO_CONFIG_DIR": str(work / "ultralytics-config")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=work)
    if result.returncode:
        raise SystemExit(f"Ultralytics failed at seed {seed}:\n{result.stderr[-3000:]}")
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    facts["onnx"] = str(Path(facts["onnx"]).relative_to(work))  # no machine path in a record
    facts["command"] = "YOLO('yolov8n.yaml').train(...); YOLO(best.pt).export(format='onnx', dynamic=True)"
    facts_path.write_text(json.dumps(facts))
    return onnx, facts


def _edgefold(work: Path, onnx: Path, seed: int) -> dict[str, Any]:
    """``edgefold run best.onnx --data coco:…`` as a user types it; the run's records."""
    runs = work / "runs" / f"seed{seed}"
    evaluation = work / "photos" / "edgefold"
    sets = ["data.train_images=800", "data.test_images=200", f"quantize.accuracy_budget_points={BUDGET_POINTS}",
            "deploy.rounds=2", "deploy.iterations=20", "deploy.idle_s=0.5"]
    command = [sys.executable, "-m", "pipeline", "run", str(onnx), "--data",
               f"coco:{evaluation / 'annotations.json'}@{evaluation / 'images'}", "--runs-dir", str(runs),
               *[item for pair in sets for item in ("--set", pair)]]
    began = time.time()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "EDGEFOLD_PROGRESS": "0"},
                            cwd=HERE.parent)
    seconds = time.time() - began
    log = (result.stdout + result.stderr).splitlines()
    record: dict[str, Any] = {"exit": result.returncode, "seconds": seconds,
                              "command": " ".join(command[1:]).replace(str(work), "$WORK"),
                              "error": [line for line in log if line.startswith(("error:", "  fix:"))]}
    latest = runs / onnx.name / "latest" / "manifest.json"
    if latest.is_file():
        stages = json.loads(latest.read_text())["stages"]
        export = stages.get("export", {}).get("metrics", {}).get("rungs", {}).get("student", {})
        record["changes"] = export.get("changes")
        record["fp32_map"] = export.get("scores", {}).get("map")
        quantize = stages.get("quantize", {}).get("metrics")
        if quantize:
            record["passed"] = True
            record["int8"] = quantize["int8"]["map"]
            record["fp32"] = {k: quantize["fp32"][k] for k in ("map", "map_low", "map_high")}
            record["change"] = quantize.get("change_vs_fp32")
            record["accepted"] = quantize["method"]
            record["attempts"] = [{"method": a["method"], "drop_points": a["drop_points"],
                                   "change": a.get("change_vs_fp32"), "kept_layers": len(a.get("kept_layers") or []),
                                   "plain_rung_kept": a.get("plain_rung_kept")} for a in quantize["attempts"]]
    if "passed" not in record:
        record["passed"] = False
        record["quantize_log"] = [line for line in log if line.startswith("quantize:")]
    return record


def _machine() -> dict[str, str]:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"
    return {"cpu": model, "isa": isa, "cores": str(os.cpu_count()), "python": platform.python_version()}


def _write(work: Path, state: dict[str, Any], out: Path) -> None:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"yolo-start-{stamp}.json").write_text(json.dumps(state, indent=1))
    lines = [f"# A YOLOv8n trained by Ultralytics, through EdgeFold's INT8 ladder ({time.strftime('%Y-%m-%d')})", "",
             GOAL, "", f"Machine: {state['machine']['cpu']} ({state['machine']['isa']}, "
             f"{state['machine']['cores']} cores), Python {state['machine']['python']}; every number on the build "
             "host's CPU (ONNX Runtime), none on a Jetson.", "",
             "| seed | Ultralytics val mAP50-95 | EdgeFold FP32 mAP [95% CI] | INT8 mAP | INT8 − FP32, points [paired 95% CI] "
             "| gate | step accepted | plain rungs (points) | mixed step |", "|---|---|---|---|---|---|---|---|---|"]
    held = []
    for seed, run in sorted(state["seeds"].items(), key=lambda item: int(item[0])):
        ours = run["edgefold"]
        yolo = run["ultralytics"]
        if not ours.get("fp32"):
            lines.append(f"| {seed} | {100 * yolo['val_map50_95']:.1f} | — | — | — | failed | "
                         f"{'; '.join(ours['error'])[:200]} | | |")
            held.append(False)
            continue
        change = ours.get("change") or {}
        plain = ", ".join(f"{a['method']} {-a['drop_points']:+.2f}" for a in ours["attempts"]
                          if a["method"] not in ("mixed", "qat"))
        mixed = next((a for a in ours["attempts"] if a["method"] == "mixed"), None)
        mixed_words = "not needed" if mixed is None else (
            "kept the plain rung" if mixed["plain_rung_kept"] else f"{mixed['kept_layers']} layer(s) in FP16, "
            f"{-mixed['drop_points']:+.2f}")
        ok = bool(ours["passed"]) and change.get("low", -1e9) >= -BUDGET_POINTS
        held.append(ok)
        lines.append(f"| {seed} | {100 * yolo['val_map50_95']:.1f} | {100 * ours['fp32']['map']:.1f} "
                     f"[{100 * ours['fp32']['map_low']:.1f}, {100 * ours['fp32']['map_high']:.1f}] | "
                     f"{100 * ours['int8']:.1f} | {change.get('points', float('nan')):+.2f} "
                     f"[{change.get('low', float('nan')):+.2f}, {change.get('high', float('nan')):+.2f}] | "
                     f"{'passed' if ours['passed'] else 'missed'} | {ours['accepted']} | {plain} | {mixed_words} |")
    lines += ["", f"Goal {'met' if held and all(held) else 'not met'}: {sum(held)} of {len(held)} seeds.", "",
              "What EdgeFold changed in each export, as its log says:", ""]
    for seed, run in sorted(state["seeds"].items(), key=lambda item: int(item[0])):
        lines.append(f"- seed {seed}: {'; '.join(run['edgefold'].get('changes') or ['—'])} "
                     f"(Ultralytics {run['ultralytics']['ultralytics']}, trained in {run['ultralytics']['train_s']:.0f} s; "
                     f"EdgeFold's run {run['edgefold']['seconds']:.0f} s)")
    lines += ["", f"Command per seed: `{next(iter(state['seeds'].values()))['edgefold']['command']}`."]
    (out / f"yolo-start-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(GOAL, flush=True)
    photos = work / "photos"
    if not (photos / "edgefold" / "annotations.json").is_file():
        for name, count, seed in (("train", 281, 100), ("val", 70, 101), ("edgefold", 1000, 102)):
            photo_set(photos / name, count, seed)
    state_path = work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"goal": GOAL, "seeds": {}}
    state["machine"] = _machine()
    for seed in args.seeds:
        if str(seed) in state["seeds"]:
            continue
        onnx, trained = _train_and_export(work, seed, args.epochs, args.size)
        print(f"seed {seed}: Ultralytics val mAP50-95 {100 * trained['val_map50_95']:.1f} in {trained['train_s']:.0f} s",
              flush=True)
        state["seeds"][str(seed)] = {"ultralytics": trained, "edgefold": _edgefold(work, onnx, seed)}
        state_path.write_text(json.dumps(state, indent=1))
    _write(work, state, args.out)


if __name__ == "__main__":
    main()
