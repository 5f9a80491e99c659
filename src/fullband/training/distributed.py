"""Data-parallel training under torchrun: process-group setup and wrapping a Trainer's model in DDP.

Applied from outside the single-device code: build the model and the Trainer with ``rank``/``world_size``,
then ``wrap_ddp(trainer)``. Each process trains on its own rows of every step (``batch_fn(step, rank,
world_size)``); DDP averages the gradients, so with equal token counts per process the run matches one
process on the global batch. Only rank 0 writes logs and checkpoints; every process keeps its optimizer
replica and its own RNG state, which checkpoints store per rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from fullband.training.trainer import Trainer


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    local_rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This process's GPU (by local rank) when CUDA is available, else the CPU."""
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")


def init_distributed(backend: str | None = None) -> DistributedEnv:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT). Without WORLD_SIZE > 1 this is a single process: rank 0 of 1, no group.

    ``backend`` defaults to NCCL with CUDA, gloo on CPU.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistributedEnv(0, 0, 1)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    return DistributedEnv(rank, local_rank, world_size)


def wrap_ddp(trainer: Trainer) -> None:
    """Make ``trainer.model`` a DDP wrapper of ``trainer.raw_model`` (whose blocks the Trainer compiled if asked)."""
    if not dist.is_initialized():
        raise RuntimeError("wrap_ddp needs an initialised process group: call init_distributed() under torchrun")
    if dist.get_world_size() != trainer.world_size or dist.get_rank() != trainer.rank:
        raise RuntimeError(f"the Trainer was built for rank {trainer.rank} of {trainer.world_size}, but this process "
                           f"is rank {dist.get_rank()} of {dist.get_world_size()}")
    device_ids = [trainer.device.index] if trainer.device.type == "cuda" else None
    # Single-pass steps never call the fusion, so its weights get no gradient there; DDP must expect that.
    find_unused = trainer.raw_model.fusion is not None
    trainer.model = DistributedDataParallel(trainer.raw_model, device_ids=device_ids,
                                            find_unused_parameters=find_unused)


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
