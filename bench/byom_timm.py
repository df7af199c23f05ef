"""Bring your own model: a timm teacher folded on an ImageFolder, over seeds.

    python bench/byom_timm.py --seeds 3        # resumable; writes bench/results/seeds-byom-convnext_atto-*.{json,md}

Goal, stated before the run: timm's ``convnext_atto`` (LayerNorm2d, depthwise 7×7 convolutions, layer-scale, GELU:
none of it in the built-in registry) as the teacher, pruned to at most 30% of its MACs and distilled, on an ImageFolder
of 64×64 images, passes every gate of the ladder on every seed, with the student's and the INT8 rung's top-1 change
reported with their intervals over seeds and the seconds each stage took.

The ImageFolder is Fashion-MNIST (Debian's ``dataset-fashion-mnist``: real photographs of garments) written as 64×64
PNG files, 600 training and 300 validation images per class, so that the run reads files as a user's folder is read.
The recipe is written below and never tuned on the validation split: its training settings are the resnet50
recipe's, its preprocessing the data's own mean and std at 64 px. :mod:`bench.recipe_seeds` runs it per seed and
records each run, its stage times and the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GOAL = ("timm's convnext_atto as the teacher, pruned to at most 30% of its MACs and distilled on an ImageFolder of "
        "64×64 images, passes every gate of the ladder on every seed (teacher and student sanity, the INT8 accuracy "
        "budget through its fallbacks); the student's and the INT8 rung's top-1 changes are reported with their "
        "intervals over seeds, and each stage's seconds")
TEACHER = "timm/convnext_atto"
SIZE = 64
PER_CLASS = {"train": 600, "val": 300}


def image_folder(root: Path) -> Path:
    """Fashion-MNIST as ``root/{train,val}/<class>/<n>.png`` at 64×64 (written once; kept between resumed runs)."""
    import cv2

    from pipeline.core.data.sources import load_source

    if (root / "done").exists():
        return root
    data = load_source("fashion-mnist")
    rng = np.random.default_rng(0)
    for split, source in (("train", data.train), ("val", data.test)):
        labels = np.asarray(source.labels)
        for label, name in enumerate(data.classes):
            folder = root / split / name.replace("/", "-").replace(" ", "_")
            folder.mkdir(parents=True, exist_ok=True)
            for index in rng.permutation(np.flatnonzero(labels == label))[:PER_CLASS[split]]:
                image = cv2.resize(np.asarray(source.image(int(index))), (SIZE, SIZE), interpolation=cv2.INTER_CUBIC)
                cv2.imwrite(str(folder / f"{index}.png"), image)
    (root / "done").write_text("")
    return root


# The data set as the result files and the README's figures name it.
DATA_NAME = "fashion-mnist as a 64 px ImageFolder"


def recipe(path: Path, folder: Path) -> Path:
    """The resnet50 recipe's ladder with a timm teacher on the folder: ≤ 30% of the teacher's MACs."""
    raw = yaml.safe_load((HERE.parent / "models" / "resnet50.yaml").read_text())
    raw.update(name=path.stem, description=f"{TEACHER} → pruned ≤30% MACs → distilled, Fashion-MNIST ImageFolder "
                                           f"at {SIZE} px")
    raw["data"] = {"source": f"imagefolder:{folder}", "calib_size": 512, "seed": 0}
    raw["preprocess"] = {"input_size": SIZE, "channels": 3, "mean": [0.2860] * 3, "std": [0.3530] * 3}
    raw["teacher"]["arch"] = TEACHER
    raw["prune"].update(macs_target=0.27, tolerance=0.1)  # relative: 24.3–29.7% of the teacher's MACs
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgefold-byom-timm"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import recipe_seeds

    args.work.mkdir(parents=True, exist_ok=True)
    folder = image_folder(args.work / "fashion-mnist-64")
    path = recipe(args.work / f"byom-{TEACHER.split('/')[1]}.yaml", folder)
    return recipe_seeds.main(["--recipe", str(path), "--seeds", str(args.seeds), "--work", str(args.work / "seeds"),
                              "--out", str(args.out), "--goal", GOAL, "--data", DATA_NAME])


if __name__ == "__main__":
    sys.exit(main())
