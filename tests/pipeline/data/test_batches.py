import numpy as np
import torch

from device.preprocess import Preprocess
from pipeline.tasks.classification.batches import Batches
from pipeline.core.data.sources import Split, load_source
from pipeline.core.recipe import AugmentConfig

PRE = Preprocess(input_size=16, resize=16, channels=3, mean=(0.3, 0.3, 0.3), std=(0.4, 0.4, 0.4))


def test_batches_equal_the_device_preprocessing():
    """Training sees exactly what the device agent feeds the engine."""
    split = load_source("digits").test
    batches = Batches(split, np.arange(10), PRE, batch_size=4)
    x, labels, positions, flipped = next(iter(batches))
    for row, position in enumerate(positions.tolist()):
        expected = PRE(split.images[position])[0]
        np.testing.assert_allclose(x[row].numpy(), expected, rtol=1e-6, atol=1e-6)
        assert labels[row] == split.labels[position]
    assert not flipped.any()


def test_iteration_covers_every_index_once_and_shuffles_per_epoch():
    split = Split(labels=np.arange(10) % 3, images=np.zeros((10, 8, 8), dtype=np.uint8))
    batches = Batches(split, np.arange(10), PRE, batch_size=3, shuffle=True, seed=1)
    first = torch.cat([p for _, _, p, _ in batches])
    second = torch.cat([p for _, _, p, _ in batches])
    assert sorted(first.tolist()) == list(range(10)) == sorted(second.tolist())
    assert first.tolist() != second.tolist()
    assert len(batches) == 4
    dropping = Batches(split, np.arange(10), PRE, batch_size=3, drop_last=True)
    assert len(dropping) == 3 and sum(len(p) for _, _, p, _ in dropping) == 9


def test_hflip_flips_exactly_the_marked_samples():
    images = np.zeros((8, 16, 16), dtype=np.uint8)
    images[:, :, :4] = 255  # bright left edge
    split = Split(labels=np.zeros(8, dtype=np.int64), images=images)
    batches = Batches(split, np.arange(8), PRE, batch_size=8, augment=AugmentConfig(hflip=True), seed=3)
    x, _, _, flipped = next(iter(batches))
    assert 0 < flipped.sum() < 8
    left_bright = x[:, 0, 0, 0] > x[:, 0, 0, -1]
    assert torch.equal(left_bright, ~flipped)


def test_file_split_goes_through_a_dataloader(tmp_path):
    import cv2

    paths = []
    for k in range(5):
        path = tmp_path / f"{k}.png"
        cv2.imwrite(str(path), np.full((20, 24, 3), 40 * k, dtype=np.uint8))
        paths.append(str(path))
    split = Split(labels=np.arange(5), paths=paths)
    x, labels, positions, _ = next(iter(Batches(split, np.arange(5), PRE, batch_size=5)))
    assert x.shape == (5, 3, 16, 16)
    np.testing.assert_allclose(x[2].numpy(), PRE(np.full((20, 24, 3), 80, dtype=np.uint8))[0], atol=1e-6)


def _file_split(tmp_path, n=8):
    import cv2

    paths = []
    for k in range(n):
        path = tmp_path / f"{k}.png"
        cv2.imwrite(str(path), np.full((20, 24, 3), 20 * k, dtype=np.uint8))
        paths.append(str(path))
    return Split(labels=np.arange(n), paths=paths)


def test_file_batches_keep_their_workers_across_epochs(tmp_path):
    batches = Batches(_file_split(tmp_path), np.arange(8), PRE, batch_size=4, shuffle=True, workers=2)
    first = torch.cat([p for _, _, p, _ in batches])
    loader = batches._loader
    second = torch.cat([p for _, _, p, _ in batches])
    assert batches._loader is loader and loader.persistent_workers, "one pool of decoding workers for every epoch"
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(8))
    assert first.tolist() != second.tolist(), "each epoch has its own order"


def test_file_batches_shard_with_distributed_sampler(tmp_path):
    split = _file_split(tmp_path)
    seen = []
    for rank in range(2):
        shard = Batches(split, np.arange(8), PRE, batch_size=4, shuffle=True, seed=1).shard(rank, 2)
        batches = list(shard)
        assert all(len(labels) == 2 for _, labels, _, _ in batches), "the global batch of 4 is split in two"
        seen.append(torch.cat([p for _, _, p, _ in batches]).tolist())
    assert sorted(seen[0] + seen[1]) == list(range(8)) and not set(seen[0]) & set(seen[1])
