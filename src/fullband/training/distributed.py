"""Data-parallel training under torchrun: process-group setup, and DDP or FSDP2 applied to a Trainer's model.

Applied from outside the single-device code: build the model and the Trainer with ``rank``/``world_size``,
then ``wrap_ddp(trainer)`` or ``wrap_fsdp(trainer)``. Each process trains on its own rows of every step
(``batch_fn(step, rank, world_size)``); DDP all-reduces and FSDP reduce-scatters the mean gradient, so with
equal token counts per process either run matches one process on the global batch. Every process keeps its
own RNG state, which checkpoints store per rank. Under DDP each process holds a full optimizer replica and
rank 0 writes checkpoints alone; under FSDP each holds 1/world_size of the weights, gradients and AdamW state
and writes its shards into the checkpoint (see :mod:`fullband.training.checkpoint`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from fullband.config import ConfigError
from fullband.model.linear import release_fused_weights
from fullband.training.optim import build_optimizer
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
    """Make ``trainer.model`` (the objective bound to ``trainer.raw_model``, whose blocks the Trainer compiled if asked)
    a DDP wrapper: one forward per micro-batch, whatever its passes."""
    _check_process_group(trainer, "wrap_ddp")
    device_ids = [trainer.device.index] if trainer.device.type == "cuda" else None
    # Single-pass steps never call the fusion, so its weights get no gradient there; DDP must expect that.
    find_unused = trainer.raw_model.fusion is not None
    trainer.model = DistributedDataParallel(trainer.model, device_ids=device_ids,
                                            find_unused_parameters=find_unused)


def wrap_fsdp(trainer: Trainer) -> None:
    """Shard ``trainer.raw_model`` in place with FSDP2 (``fully_shard``) and rebuild the optimizer over the shards.

    Each transformer block is one FSDP unit: its weights are all-gathered just before it runs and freed after,
    in forward and again in backward (a multi-pass forward runs every block once per pass, gathering it each
    time). The root unit holds the rest: the embedding, which is also the output head when tied (one parameter,
    so necessarily one unit), the final norm and the fusion. Single-pass steps never call the fusion; FSDP2
    then leaves its gradients None, as one process does, so AdamW skips it alike. Call before training.
    """
    _check_process_group(trainer, "wrap_fsdp")
    if trainer.optim_cfg.optimizer != "adamw":
        raise ConfigError(f"optim.optimizer={trainer.optim_cfg.optimizer!r} is invalid with train.parallel='fsdp': "
                          "(Nor)Muon orthogonalises whole matrices and FSDP holds shards; use parallel='ddp' or adamw")
    if trainer.optimizer.state:
        raise RuntimeError("wrap_fsdp must come before training: the optimizer already holds state for the "
                           "unsharded parameters")
    model = trainer.raw_model
    release_fused_weights(model)  # sharded blocks decode unfused (fullband.model.linear): no copy to keep
    mesh = init_device_mesh(trainer.device.type, (trainer.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # trainer.model stays the objective bound to this model: fully_shard changed the module's class in place, and
    # each pass is a forward of it, which gathers and frees the root's weights as a block's.
    # fully_shard replaced every parameter by a DTensor shard, so the optimizer Trainer.__init__ built points at
    # tensors that are no longer the model's; a new one (same groups, same settings) steps the shards.
    trainer.optimizer = build_optimizer(model, trainer.optim_cfg)


def _check_process_group(trainer: Trainer, caller: str) -> None:
    if not dist.is_initialized():
        raise RuntimeError(f"{caller} needs an initialised process group: call init_distributed() under torchrun")
    if dist.get_world_size() != trainer.world_size or dist.get_rank() != trainer.rank:
        raise RuntimeError(f"the Trainer was built for rank {trainer.rank} of {trainer.world_size}, but this process "
                           f"is rank {dist.get_rank()} of {dist.get_world_size()}")


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
