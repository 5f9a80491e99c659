"""Run a study's independent jobs (training runs, seeds) several at a time, each in its own process.

Every job is a deterministic function of its arguments, so the numbers do not depend on how many run at once;
the torch threads of this process are shared out between the workers.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch


def map_jobs(fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]], workers: int) -> Iterator[Any]:
    """``fn(*job)`` for every job, yielded in the order of ``jobs`` (each as soon as it and those before it are
    done). ``workers <= 1``: one after the other in this process; more: that many at a time in fresh (spawned)
    processes with ``torch.get_num_threads() // workers`` threads each. ``fn`` must be a module-level function
    and the jobs picklable."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield fn(*job)
        return
    workers = min(workers, len(jobs))
    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")  # no fork of a process whose OpenMP pool is running
    with ProcessPoolExecutor(workers, mp_context=context, initializer=torch.set_num_threads,
                             initargs=(threads,)) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        for future in futures:
            yield future.result()
