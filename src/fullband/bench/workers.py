"""The training step as ``fullband compare`` runs it on a CPU: several runs at a time, each in its own process with
the torch threads shared out (``fullband.experiments.core.parallel.map_jobs``). Each worker times its steps and a matmul
of its own in interleaved rounds while the others do the same, so the sum over workers is what the study gets out
of the machine and what it could get at most."""

from __future__ import annotations

import copy
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

from fullband.bench.config import BenchOptimConfig
from fullband.bench.steps import fullband_loss, optimizer_step, train_model
from fullband.bench.timing import interleaved, matmul_case
from fullband.training.config import OptimConfig


def time_in_workers(variants: dict[str, OptimConfig], cfg: BenchOptimConfig, compiled: bool, workers: int,
                    rounds: int, seed: int) -> tuple[list[dict[str, list[float]]], int]:
    """One dict per worker: each variant's seconds per step and its matmul's (key ``"matmul"``) seconds per call,
    one entry per round; and the threads each worker ran with (this process's, shared out as compare does).
    Every worker builds the same model and batch from ``seed`` and starts timing when all are ready."""
    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")  # no fork of a process whose OpenMP pool is running
    with context.Manager() as manager:
        ready = manager.Barrier(workers)
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(_time_worker, variants, cfg, compiled, threads, rounds, seed, ready)
                       for _ in range(workers)]
            return [future.result() for future in futures], threads


def _time_worker(variants: dict[str, OptimConfig], cfg: BenchOptimConfig, compiled: bool, threads: int,
                 rounds: int, seed: int, ready: Any) -> dict[str, list[float]]:
    from fullband.training.optim import build_optimizer

    try:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        model, tokens = train_model(cfg)
        cases = {}
        for name, optim_cfg in variants.items():
            net = copy.deepcopy(model)
            if compiled:
                net.compile_blocks()
            optimizer, params = build_optimizer(net, optim_cfg), list(net.parameters())
            loss_fn = fullband_loss(net, tokens, cfg.passes)
            cases[name] = lambda loss_fn=loss_fn, optimizer=optimizer, params=params: optimizer_step(
                loss_fn, optimizer, params)
        cases["matmul"] = matmul_case(torch.device("cpu"))[0]
        for step in cases.values():  # compiles, allocates the optimizers' state: not while the others time
            for _ in range(2):
                step()
    except BaseException:
        ready.abort()  # the others stop waiting (BrokenBarrierError) instead of hanging the bench
        raise
    ready.wait()
    return interleaved(cases, rounds, torch.device("cpu"), reps=cfg.steps_per_round, warmup=0)


def combined_share(per_worker: list[dict[str, list[float]]], name: str, step_flops: float,
                   peak_flops: float) -> float:
    """The workers' summed model FLOP/s of case ``name`` over their summed matmul FLOP/s, round by round (the
    rounds run side by side); the median over rounds."""
    rounds = len(per_worker[0][name])
    return statistics.median(
        sum(step_flops / w[name][r] for w in per_worker) / sum(peak_flops / w["matmul"][r] for w in per_worker)
        for r in range(rounds))
