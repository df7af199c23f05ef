"""Multi-process training under ``torchrun`` (PyTorch DDP): NCCL on GPUs, gloo on CPU.

``torchrun --nproc_per_node=N -m pipeline run MODEL`` starts N copies of the pipeline. Every rank
walks the same stages; the training stages (teacher, distill) train one DDP model together, every
other stage runs on rank 0 while the others wait at a barrier. Only rank 0 writes checkpoints, the
manifest and logs. Outside torchrun (no ``WORLD_SIZE``), everything here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


def world() -> World:
    """Read from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
    return World(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                 int(os.environ.get("LOCAL_RANK", 0)))


def init() -> World:
    """Joins the process group once (NCCL when this rank has a GPU, else gloo)."""
    me = world()
    if me.distributed and not dist.is_initialized():
        use_cuda = torch.cuda.is_available() and os.environ.get("EDGEFOLD_DEVICE", "cuda").startswith("cuda")
        if use_cuda:
            torch.cuda.set_device(me.local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return me


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sums numbers across ranks (identity outside DDP)."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast_object(obj, source: int = 0):
    """Rank ``source``'s object on every rank (identity outside DDP)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=source)
    return box[0]


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
