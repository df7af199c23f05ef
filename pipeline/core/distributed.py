"""Multi-process training under ``torchrun`` (PyTorch DDP): NCCL on GPUs, gloo on CPU.

``torchrun --nproc_per_node=N -m pipeline run MODEL`` starts N copies of the pipeline. Every rank
walks the same stages; the training stages (teacher, distill) train one DDP model together, every
other stage runs on rank 0 while the others wait at a barrier. Only rank 0 writes checkpoints, the
manifest and logs. Outside torchrun (no ``WORLD_SIZE``), everything here is a no-op.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place among the ranks."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


_alone = False  # inside a stage rank 0 runs by itself under torchrun (:func:`alone`)


def world() -> World:
    """Read from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK); a world of one inside :func:`alone`."""
    if _alone:
        return World()
    return World(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                 int(os.environ.get("LOCAL_RANK", 0)))


@contextmanager
def alone(flag: bool = True) -> Iterator[None]:
    """Within, this process is a world of one: no sharding, no DDP, no collective (the runner's scope for a stage
    that is not ``distributed``, which rank 0 runs while the other ranks wait at a barrier: a collective there
    would wait for ranks that never join)."""
    global _alone
    previous, _alone = _alone, flag
    try:
        yield
    finally:
        _alone = previous


def _active() -> bool:
    """Whether collectives reach the other ranks (a process group, and not inside :func:`alone`)."""
    return dist.is_available() and dist.is_initialized() and not _alone


def init() -> World:
    """Joins the process group once (NCCL when this rank has a GPU, else gloo)."""
    me = world()
    if me.distributed and not dist.is_initialized():
        use_cuda = torch.cuda.is_available() and os.environ.get("EDGEFOLD_DEVICE", "cuda").startswith("cuda")
        if use_cuda:
            torch.cuda.set_device(me.local_rank)
        # Ranks other than 0 wait at a barrier while rank 0 alone prunes, quantizes or benchmarks:
        # the default timeouts (10 min NCCL, 30 min gloo) are too short for that.
        timeout = timedelta(hours=4)
        # torchrun restarts every rank when one dies (--max-restarts); the store still holds the
        # previous attempt's addresses, so each attempt gets keys of its own.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), me.size,
                              is_master=me.main and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
                              timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("nccl" if use_cuda else "gloo", store=dist.PrefixStore(f"edgefold/{attempt}", store),
                                rank=me.rank, world_size=me.size, timeout=timeout)
    return me


def require_divisible(batch_size: int, world_size: int) -> None:
    """Refuses a global batch that does not split evenly over the ranks (each rank takes every ``world``-th image).

    Raises:
        ConfigError: With the batch size and the process count.
    """
    if batch_size % world_size:
        from device.errors import ConfigError

        raise ConfigError(f"batch_size {batch_size} does not split over {world_size} processes",
                          fix=f"use a global batch size divisible by {world_size} (it is split across the ranks)")


def barrier() -> None:
    if _active():
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sums numbers across ranks (identity outside DDP)."""
    if not _active():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast_object(obj, source: int = 0):
    """Rank ``source``'s object on every rank (identity outside DDP)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=source)
    return box[0]


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class _AllReduceSum(torch.autograd.Function):
    """Sum across ranks, differentiable: the backward pass sums the gradients the same way."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


class CpuSyncBatchNorm(torch.nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are the global batch's, across gloo ranks on CPU.

    torch's SyncBatchNorm runs only on CUDA; this does the same with a differentiable all-reduce of
    per-channel sums, so DDP on CPU normalizes exactly as one process with the whole batch would.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not _active():
            return super().forward(x)
        count = torch.tensor([x.numel() / x.shape[1]], dtype=x.dtype, device=x.device)
        local = torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), count])
        total = _AllReduceSum.apply(local)
        channels = x.shape[1]
        n = total[-1]
        mean = total[:channels] / n
        var = (total[channels:2 * channels] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                self.running_var.mul_(1 - momentum).add_(momentum * var.detach() * n / max(float(n) - 1, 1.0))
        y = (x - mean.view(1, -1, 1, 1)) * torch.rsqrt(var.view(1, -1, 1, 1) + self.eps)
        if self.affine:
            y = y * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)
        return y


def convert_sync_batchnorm(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """BatchNorm2d → SyncBatchNorm (CUDA) or :class:`CpuSyncBatchNorm` (CPU), keeping parameters and stats."""
    if device.type == "cuda":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if type(module) is torch.nn.BatchNorm2d:
        synced = CpuSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats)
        synced.load_state_dict(module.state_dict())
        synced.train(module.training)
        return synced
    for name, child in module.named_children():
        replaced = convert_sync_batchnorm(child, device)
        if replaced is not child:
            setattr(module, name, replaced)
    return module
