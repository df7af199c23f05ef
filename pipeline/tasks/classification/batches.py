"""Torch batch iterators over a split: preprocessing once, augmentation per batch.

In-memory sources (Fashion-MNIST, digits) are preprocessed once into a uint8 tensor and
sliced per batch, which on two cores is several times faster than a per-item DataLoader.
File sources (image folders) go through a DataLoader with workers and pinned memory.
Both yield ``(inputs, labels, positions)``; ``positions`` index the selected subset, so a
cache (the teacher's logits) can be looked up per sample.

Under DDP (:meth:`Batches.shard`) each rank takes every ``world``-th sample of each global batch,
the interleaving of ``DistributedSampler``, drawn from the same seeded order and the same
augmentation draws as one process: the union of the ranks' batches is the single-process batch.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from device.preprocess import Preprocess
from pipeline.core.data.sources import Split
from pipeline.core.distributed import require_divisible
from pipeline.core.recipe import AugmentConfig


class _FileImages(torch.utils.data.Dataset):
    def __init__(self, split: Split, indices: np.ndarray, preprocess: Preprocess):
        self.split, self.indices, self.preprocess = split, indices, preprocess

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int):
        image = self.preprocess.geometry(self.split.image(int(self.indices[position])))
        return torch.from_numpy(image), int(self.split.labels[self.indices[position]]), position


class Batches:
    """Iterates a subset of a split as normalized NCHW float batches.

    Args:
        split: The source split.
        indices: Which images of the split, in order.
        preprocess: The shared preprocessing definition.
        batch_size: Images per batch.
        shuffle: Reshuffle every epoch (seeded by ``seed`` and the epoch number).
        augment: Per-batch augmentation (training only).
        seed: Base seed for shuffling and augmentation.
        workers: DataLoader workers for file sources.
        drop_last: Drop a last incomplete batch (training; keeps BatchNorm statistics sane).
    """

    def __init__(self, split: Split, indices: np.ndarray, preprocess: Preprocess, batch_size: int,
                 shuffle: bool = False, augment: AugmentConfig | None = None, seed: int = 0,
                 workers: int = 0, drop_last: bool = False, cache: dict | None = None):
        self.split, self.indices, self.preprocess = split, np.asarray(indices, dtype=np.int64), preprocess
        self.batch_size, self.shuffle, self.augment = batch_size, shuffle, augment or AugmentConfig()
        self.seed, self.workers, self.drop_last = seed, workers, drop_last
        self.epoch = 0
        self.rank, self.world = 0, 1
        self._loader = None
        self.labels = torch.from_numpy(split.labels[self.indices])
        self._mean = torch.tensor(preprocess.mean, dtype=torch.float32).view(1, -1, 1, 1)
        self._std = torch.tensor(preprocess.std, dtype=torch.float32).view(1, -1, 1, 1)
        self._images = None
        if split.in_memory:
            key = (id(split), self.indices.tobytes(), repr(preprocess))
            if cache is not None and key in cache:
                self._images = cache[key]
            else:
                geometry = np.stack([preprocess.geometry(split.images[i]) for i in self.indices])
                self._images = torch.from_numpy(geometry)
                if cache is not None:
                    cache[key] = self._images

    def __len__(self) -> int:
        n = len(self.indices)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def input_size(self) -> int:
        """The network's input side in pixels (the training engine picks the memory format by it)."""
        return self.preprocess.input_size

    def shard(self, rank: int, world: int) -> "Batches":
        """Makes this iterator yield rank ``rank``'s share of each global batch of ``batch_size``."""
        require_divisible(self.batch_size, world)
        self.rank, self.world = rank, world
        return self

    def normalize(self, batch_uint8_nhwc: torch.Tensor) -> torch.Tensor:
        """The torch twin of :meth:`Preprocess.normalize` (same arithmetic, batched)."""
        data = batch_uint8_nhwc.permute(0, 3, 1, 2).float().div_(255.0)
        return data.sub_(self._mean).div_(self._std)

    def _draws(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Random flips and crop offsets for a whole global batch (the same on every rank)."""
        flips = torch.rand(n, generator=generator) < 0.5 if self.augment.hflip else None
        pad = self.augment.crop_padding
        offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator) if pad else None
        return flips, offsets

    def _augment(self, x: torch.Tensor, flips: torch.Tensor | None,
                 offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        flipped = torch.zeros(len(x), dtype=torch.bool) if flips is None else flips
        if flips is not None:
            x = torch.where(flipped.view(-1, 1, 1, 1), x.flip(3), x)
        if offsets is not None:
            pad, size = self.augment.crop_padding, x.shape[-1]
            padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
            x = torch.stack([padded[i, :, oy : oy + size, ox : ox + size] for i, (oy, ox) in enumerate(offsets.tolist())])
        return x, flipped

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yields ``(inputs, labels, positions, flipped)``."""
        generator = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        order = torch.randperm(len(self.indices), generator=generator) if self.shuffle else torch.arange(len(self.indices))
        self.epoch += 1
        if self._images is not None:
            for start in range(0, len(order), self.batch_size):
                positions = order[start : start + self.batch_size]
                if self.drop_last and len(positions) < self.batch_size:
                    break
                flips, offsets = self._draws(len(positions), generator)
                mine = slice(self.rank, None, self.world)
                positions = positions[mine]
                x, flipped = self._augment(self.normalize(self._images[positions]),
                                           flips[mine] if flips is not None else None,
                                           offsets[mine] if offsets is not None else None)
                yield x, self.labels[positions], positions, flipped
            return
        for images, labels, positions in self._file_loader(order):
            x, flipped = self._augment(self.normalize(images), *self._draws(len(images), generator))
            yield x, labels, positions, flipped

    def _file_loader(self, order: torch.Tensor):
        """Decoding on DataLoader workers (kept alive across epochs), pinned memory on CUDA hosts."""
        dataset = _FileImages(self.split, self.indices, self.preprocess)
        if self.world > 1:
            sampler = torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=self.world, rank=self.rank, shuffle=self.shuffle, seed=self.seed,
                drop_last=self.drop_last)
            sampler.set_epoch(self.epoch - 1)
        else:
            sampler = self._order = getattr(self, "_order", [])
            sampler[:] = order.tolist()  # the persistent workers' loader reads this epoch's order
        if self._loader is None or self.world > 1 or not self.workers:
            self._loader = torch.utils.data.DataLoader(
                dataset, batch_size=self.batch_size // self.world, sampler=sampler, num_workers=self.workers,
                pin_memory=torch.cuda.is_available(), persistent_workers=self.workers > 0,
                prefetch_factor=4 if self.workers else None, drop_last=self.drop_last)
        return self._loader
