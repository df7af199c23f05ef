"""Classification's part of the data stage (:class:`pipeline.core.data.hooks.DataHooks`): deterministic train /
calibration / test splits of the recipe's source, every class and every image checked before any training."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

from device.errors import DataError, EdgeFoldError
from device.preprocess import read_image
from pipeline.core.data.hooks import DataHooks, Splits
from pipeline.core.log import log
from pipeline.tasks.classification.images import data_set, preprocess_of


class ClassificationData(DataHooks):
    """Splits of an image source by seed: see the module's docstring."""

    def keys(self, ctx):
        # The source's fingerprint makes a changed data set invalidate the splits.
        return {"preprocess": preprocess_of(ctx).to_dict(), "fingerprint": data_set(ctx).fingerprint}

    def split(self, ctx, workdir):
        cfg, dataset = ctx.recipe.data, data_set(ctx)
        check_classes(dataset, cfg.allow_missing_test_classes)
        rng = np.random.default_rng(cfg.seed)
        order = rng.permutation(len(dataset.train))
        train_size = min(cfg.train_size or len(order), len(order))
        train = np.sort(order[:train_size])
        rest = order[train_size:]
        # Calibration images come from outside the training subset when there are enough,
        # so INT8 calibration does not only see images the model memorised.
        if len(rest) >= cfg.calib_size:
            calib = np.sort(rest[: cfg.calib_size])
        else:
            calib = np.sort(rng.choice(len(dataset.train), size=min(cfg.calib_size, len(dataset.train)), replace=False))
        test = np.arange(len(dataset.test))
        if cfg.test_size and cfg.test_size < len(test):
            test = np.sort(rng.choice(len(test), size=cfg.test_size, replace=False))
        decoded = check_decodable(dataset.train, np.union1d(train, calib), "training") \
            + check_decodable(dataset.test, test, "test")
        np.savez(workdir / "splits.npz", train=train, calib=calib, test=test)
        counts = np.bincount(dataset.train.labels[train], minlength=dataset.num_classes)
        warnings = balance_warnings(counts, dataset.classes, cfg)
        for warning in warnings:
            log(f"data: warning: {warning}")
        return Splits(dataset.name, dataset.classes, {"splits": workdir / "splits.npz"},
                      {"train": int(len(train)), "calib": int(len(calib)), "test": int(len(test)),
                       "images_decoded": decoded, "train_per_class_min": int(counts.min()),
                       "train_per_class_max": int(counts.max()),
                       "train_per_class": dict(zip(dataset.classes, counts.astype(int).tolist())),
                       "warnings": warnings},
                      {"fingerprint": dataset.fingerprint, "preprocess": preprocess_of(ctx).to_dict()})

    def summary(self, metrics):
        return (f"{metrics['source']}: {metrics['num_classes']} classes, {metrics['train']} train / "
                f"{metrics['calib']} calib / {metrics['test']} test"
                + (f"; {len(metrics['warnings'])} warnings" if metrics.get("warnings") else ""))


def check_classes(dataset, allow_missing_test: bool) -> None:
    """Every class has training images, and the test split covers every class (unless allowed).

    Raises:
        DataError: Naming the classes and the fix.
    """
    train = np.bincount(dataset.train.labels, minlength=dataset.num_classes)
    empty = [dataset.classes[i] for i in np.flatnonzero(train == 0)]
    if empty:
        raise DataError(f"{dataset.name}: {len(empty)} classes have no training images: {empty[:5]}",
                        fix="remove the empty class folders or add images to them (a class with no images still "
                            "gets an output the model can never learn)")
    test = np.bincount(dataset.test.labels, minlength=dataset.num_classes)
    missing = [dataset.classes[i] for i in np.flatnonzero(test == 0)]
    if missing and not allow_missing_test:
        raise DataError(f"{dataset.name}: the test split has no images of {len(missing)} classes: {missing[:5]}",
                        fix="add images of those classes to val/, or set data.allow_missing_test_classes: true")


def check_decodable(split, indices: np.ndarray, what: str) -> int:
    """Decodes every image of a file-based split once, before any training, and names the bad ones.

    Images are otherwise decoded only when used: a corrupt test image would surface after the
    teacher trained for an hour. Returns the number of images decoded (0 for in-memory splits).

    Raises:
        DataError: Listing the files that do not decode, with the fix.
    """
    if split.in_memory or not len(indices):
        return 0
    bad: list[str] = []

    def decode(index: int) -> None:
        try:
            image = read_image(split.paths[index])
            if image.size == 0:
                raise EdgeFoldError("empty image")
        except EdgeFoldError:
            bad.append(split.paths[index])

    with ThreadPoolExecutor(max_workers=4) as pool:  # OpenCV releases the GIL while decoding
        for _ in tqdm(pool.map(decode, indices.tolist()), total=len(indices), desc=f"checking {what} images",
                      unit="img", leave=False, file=sys.stderr, disable=None):
            pass
    if bad:
        listed = "\n    ".join(sorted(bad)[:10])
        raise DataError(f"{len(bad)} of {len(indices)} {what} images cannot be decoded:\n    {listed}"
                        + ("\n    …" if len(bad) > 10 else ""),
                        fix="remove or replace those files (OpenCV could not read them), then run again")
    return len(indices)


def balance_warnings(counts: np.ndarray, classes: list[str], cfg) -> list[str]:
    """Warnings about classes too small to learn, or a training split far out of balance.

    A class with a tenth of the others' images is often never predicted at all; the fix is more
    images, or class-balanced loss weights (``data.class_balance: loss_weights``).
    """
    warnings = []
    small = [f"{classes[i]} ({int(counts[i])})" for i in np.flatnonzero(counts < cfg.min_images_per_class)]
    if small:
        warnings.append(f"{len(small)} classes have fewer than {cfg.min_images_per_class} training images: "
                        f"{', '.join(small[:5])}{' …' if len(small) > 5 else ''}")
    if counts.min() and counts.max() / counts.min() >= cfg.imbalance_warning_ratio:
        warnings.append(f"the training split is imbalanced: the largest class has {counts.max() / counts.min():.1f}× "
                        f"the images of the smallest ({int(counts.max())} vs {int(counts.min())})")
    if warnings and cfg.class_balance == "none":
        warnings.append("consider data.class_balance: loss_weights, or more images of the small classes")
    return warnings
