"""A process's global RNG states (Python, NumPy, torch, CUDA), captured and restored for checkpoints."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_process_rng() -> dict[str, Any]:
    """This process's global RNG states, in a form ``torch.load(weights_only=True)`` accepts."""
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def restore_process_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np_state = states["numpy"]
    np.random.set_state((np_state["name"], np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
