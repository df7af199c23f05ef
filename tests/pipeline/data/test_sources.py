import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from device.errors import DataError, UnknownKeyError
from pipeline.core.data.sources import (
    FASHION_MNIST_DIR, check_source_name, load_fashion_mnist, load_source, read_idx,
)


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> Path:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def fake_fashion_mnist(root: Path, n_train=20, n_test=10) -> Path:
    rng = np.random.default_rng(0)
    write_idx(root / "train-images-idx3-ubyte", rng.integers(0, 256, (n_train, 28, 28)))
    write_idx(root / "train-labels-idx1-ubyte", np.arange(n_train) % 10)
    write_idx(root / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28)), gz=False)
    write_idx(root / "t10k-labels-idx1-ubyte", np.arange(n_test) % 10, gz=False)
    return root


def test_idx_round_trip(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "a", array)), array)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "b", array, gz=False)), array)


def test_idx_truncated_file_is_named(tmp_path):
    path = write_idx(tmp_path / "t", np.zeros((4, 2, 2)), gz=False)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DataError, match=r"header says \(4, 2, 2\) = 16 bytes but 13 follow"):
        read_idx(path)


def test_idx_bad_magic_and_type(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01" + bytes(8))
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(bad)
    floats = tmp_path / "floats"
    floats.write_bytes(bytes([0, 0, 0x0D, 1]) + (1).to_bytes(4, "big") + bytes(4))
    with pytest.raises(DataError, match="not unsigned bytes"):
        read_idx(floats)


def test_fashion_mnist_from_a_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEFOLD_FASHION_MNIST_DIR", str(fake_fashion_mnist(tmp_path)))
    data = load_source("fashion-mnist")
    assert data.num_classes == 10 and data.classes[9] == "Ankle boot"
    assert len(data.train) == 20 and len(data.test) == 10
    assert data.train.image(3).shape == (28, 28) and data.train.labels[3] == 3
    assert set(data.fingerprint) == {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}


def test_fashion_mnist_missing_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEFOLD_FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as err:
        load_source("fashion-mnist")
    assert "Fashion-MNIST not found" in err.value.message
    assert "apt-get install dataset-fashion-mnist" in err.value.fix and "DATA=" in err.value.fix


def test_fashion_mnist_label_image_mismatch(tmp_path):
    root = fake_fashion_mnist(tmp_path)
    write_idx(root / "t10k-labels-idx1-ubyte", np.zeros(7), gz=False)
    with pytest.raises(DataError, match="images do not match"):
        load_fashion_mnist(str(root))


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DIR) or os.environ.get("EDGEFOLD_FASHION_MNIST_DIR"),
                    reason="Debian's dataset-fashion-mnist is not installed (CI installs it)")
def test_real_fashion_mnist():
    data = load_fashion_mnist()
    assert (len(data.train), len(data.test)) == (60000, 10000)
    assert data.train.images.shape == (60000, 28, 28)
    np.testing.assert_array_equal(np.bincount(data.test.labels), [1000] * 10)


def test_digits_split_is_deterministic_and_stratified():
    a, b = load_source("digits"), load_source("digits")
    assert len(a.train) + len(a.test) == 1797
    np.testing.assert_array_equal(a.test.labels, b.test.labels)
    counts = np.bincount(a.test.labels)
    assert counts.min() >= 30 and a.train.images.dtype == np.uint8 and a.train.images.max() == 255


def write_folder(root: Path, classes=("cat", "dog"), per_class=3):
    import cv2

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for index, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for k in range(per_class):
                image = rng.integers(0, 256, (10 + k, 12, 3), dtype=np.uint8)
                cv2.imwrite(str(folder / f"{k}.{'png' if k % 2 else 'jpg'}"), image)
    (root / "train" / "cat" / "notes.txt").write_text("ignored")
    return root


def test_imagefolder_reads_train_and_val(tmp_path):
    data = load_source(f"imagefolder:{write_folder(tmp_path)}")
    assert data.classes == ["cat", "dog"]
    assert len(data.train) == 6 and len(data.test) == 6
    assert data.train.image(0).shape == (10, 12, 3)
    assert list(data.train.labels) == [0, 0, 0, 1, 1, 1]
    assert data.fingerprint["files"] == 12


def test_imagefolder_errors(tmp_path):
    with pytest.raises(DataError, match="is not a directory"):
        load_source(f"imagefolder:{tmp_path / 'missing'}")
    (tmp_path / "train" / "only").mkdir(parents=True)
    with pytest.raises(DataError, match="need at least 2"):
        load_source(f"imagefolder:{tmp_path}")
    root = write_folder(tmp_path / "x")
    (root / "val" / "bird").mkdir()
    with pytest.raises(DataError, match="classes not in train/"):
        load_source(f"imagefolder:{root}")


def test_source_names_are_checked():
    check_source_name("imagefolder:/data")
    with pytest.raises(UnknownKeyError, match="did you mean 'digits'"):
        check_source_name("digit")
    with pytest.raises(DataError, match="imagefolder needs a path"):
        check_source_name("imagefolder")
