"""Image sources: Fashion-MNIST (embedded default), scikit-learn digits, and image folders.

A source yields raw uint8 RGB/grey images and integer labels for a ``train`` and a ``test``
split; preprocessing is applied later by :class:`device.preprocess.Preprocess`. No torch here.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from device.errors import DataError
from device.files import sha256_file
from device.preprocess import read_image
from device.registry import Registry

FASHION_MNIST_ENV = "EDGEFOLD_FASHION_MNIST_DIR"
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


@dataclass
class Split:
    """One split: labels plus either in-memory images or image file paths."""

    labels: np.ndarray
    images: np.ndarray | None = None
    paths: list[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def in_memory(self) -> bool:
        return self.images is not None

    def image(self, index: int) -> np.ndarray:
        if self.images is not None:
            return self.images[index]
        return read_image(self.paths[index])


@dataclass
class DataSet:
    """A loaded source: class names, splits and a fingerprint of the bytes it came from."""

    name: str
    classes: list[str]
    train: Split
    test: Split
    fingerprint: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


SOURCES: Registry[Callable[[str], DataSet]] = Registry("data source")


def check_source_name(source: str) -> None:
    """Validates a ``data.source`` value without loading anything.

    Raises:
        UnknownKeyError: For an unknown source name, suggesting near ones.
    """
    name, _, argument = source.partition(":")
    SOURCES.get(name)
    if name == "imagefolder" and not argument:
        raise DataError("imagefolder needs a path: imagefolder:/path/to/data", fix="DATA=imagefolder:/data/imagenet")


def load_source(source: str) -> DataSet:
    """Loads the data set named by a recipe's ``data.source``."""
    name, _, argument = source.partition(":")
    return SOURCES.get(name)(argument)


# ---------------------------------------------------------------- Fashion-MNIST (IDX files)
def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parses an IDX file (optionally gzipped) of unsigned bytes, as used by (Fashion-)MNIST.

    Raises:
        DataError: If the header, type code or length is wrong.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as err:
        raise DataError(f"cannot read {path}: {err}", fix="reinstall the data set (the file is truncated or corrupt)") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path} is not an IDX file (bad magic {data[:4].hex()})", fix="point at the original *-ubyte(.gz) files")
    if data[2] != 0x08:
        raise DataError(f"{path}: IDX type 0x{data[2]:02x} is not unsigned bytes (0x08)", fix="only uint8 IDX files are supported")
    ndim = data[3]
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims)) if dims else 0
    if len(data) - header != expected:
        raise DataError(
            f"{path}: header says {dims} = {expected} bytes but {len(data) - header} follow",
            fix="the file is truncated or corrupt; reinstall the data set",
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def fashion_mnist_dir() -> Path:
    return Path(os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_DIR)


@SOURCES.register("fashion-mnist")
def load_fashion_mnist(argument: str = "") -> DataSet:
    """Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (or ``$EDGEFOLD_FASHION_MNIST_DIR``)."""
    root = Path(argument) if argument else fashion_mnist_dir()
    files = {
        "train_images": "train-images-idx3-ubyte",
        "train_labels": "train-labels-idx1-ubyte",
        "test_images": "t10k-images-idx3-ubyte",
        "test_labels": "t10k-labels-idx1-ubyte",
    }
    found = {}
    for key, stem in files.items():
        for candidate in (root / f"{stem}.gz", root / stem):
            if candidate.is_file():
                found[key] = candidate
                break
        else:
            raise DataError(
                f"Fashion-MNIST not found: {root / stem}.gz is missing",
                fix="install it with `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu), "
                f"set {FASHION_MNIST_ENV}=/dir/with/idx/files, or pass DATA=digits or DATA=imagefolder:/path",
            )
    arrays = {key: read_idx(path) for key, path in found.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"Fashion-MNIST {split}: {images.shape} images do not match {labels.shape} labels",
                fix="reinstall the data set",
            )
        if labels.max(initial=0) >= len(FASHION_MNIST_CLASSES):
            raise DataError(f"Fashion-MNIST {split}: label {labels.max()} out of range", fix="reinstall the data set")
    return DataSet(
        name="fashion-mnist",
        classes=list(FASHION_MNIST_CLASSES),
        train=Split(arrays["train_labels"].astype(np.int64), images=arrays["train_images"]),
        test=Split(arrays["test_labels"].astype(np.int64), images=arrays["test_images"]),
        fingerprint={path.name: sha256_file(path) for path in found.values()},
    )


# ---------------------------------------------------------------- scikit-learn digits
@SOURCES.register("digits")
def load_digits(argument: str = "") -> DataSet:
    """scikit-learn's 8×8 digits (1797 images); a seeded stratified 80/20 train/test split.

    Every model scores 97–99% here: for fast tests, not for reported accuracy.
    """
    import sklearn
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    rng = np.random.default_rng(1797)
    test_mask = np.zeros(len(labels), dtype=bool)
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        test_mask[rng.choice(members, size=len(members) // 5, replace=False)] = True
    return DataSet(
        name="digits",
        classes=[str(c) for c in range(10)],
        train=Split(labels[~test_mask], images=images[~test_mask]),
        test=Split(labels[test_mask], images=images[test_mask]),
        fingerprint={"sklearn": sklearn.__version__, "images_sha256": hashlib.sha256(images.tobytes()).hexdigest()},
    )


# ---------------------------------------------------------------- image folders (ImageNet layout)
def _scan_folder(root: Path, split: str, classes: list[str] | None) -> tuple[list[str], list[str], np.ndarray]:
    split_dir = root / split
    if not split_dir.is_dir():
        raise DataError(
            f"imagefolder: {split_dir} does not exist",
            fix=f"lay out {root}/train/<class>/*.jpg and {root}/val/<class>/*.jpg (ImageNet's layout)",
        )
    found = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    if classes is None:
        classes = found
        if len(classes) < 2:
            raise DataError(f"imagefolder: {split_dir} has {len(classes)} class folders; need at least 2",
                            fix="one sub-folder per class")
    else:
        extra = sorted(set(found) - set(classes))
        if extra:
            raise DataError(f"imagefolder: {split_dir} has classes not in train/: {extra[:5]}",
                            fix="val/ must use the class folder names of train/")
    paths, labels = [], []
    for index, name in enumerate(classes):
        folder = split_dir / name
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                paths.append(str(path))
                labels.append(index)
    if not paths:
        raise DataError(f"imagefolder: no images under {split_dir}", fix=f"supported suffixes: {sorted(IMAGE_SUFFIXES)}")
    return classes, paths, np.asarray(labels, dtype=np.int64)


@SOURCES.register("imagefolder")
def load_imagefolder(argument: str) -> DataSet:
    """``imagefolder:/path`` with ``train/<class>/…`` and ``val/<class>/…`` (decoded by OpenCV)."""
    root = Path(argument).expanduser()
    if not root.is_dir():
        raise DataError(f"imagefolder: {root} is not a directory", fix="DATA=imagefolder:/path/with/train/and/val")
    classes, train_paths, train_labels = _scan_folder(root, "train", None)
    _, test_paths, test_labels = _scan_folder(root, "val", classes)
    listing = hashlib.sha256()
    for path in train_paths + test_paths:
        listing.update(f"{os.path.relpath(path, root)}\0{os.path.getsize(path)}\n".encode())
    return DataSet(
        name=f"imagefolder:{root}",
        classes=classes,
        train=Split(train_labels, paths=train_paths),
        test=Split(test_labels, paths=test_paths),
        fingerprint={"files": len(train_paths) + len(test_paths), "listing_sha256": listing.hexdigest()},
    )
