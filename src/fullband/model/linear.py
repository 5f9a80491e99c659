"""``Linear``: ``nn.Linear`` whose inference on a CPU runs float32 weights of some size through oneDNN.

PyTorch's default float32 matmul (MKL) splits a product with few rows badly over threads. Measured on 2 quiet
cores with weights cycled through memory as a model does (benchmarks in docs/LOG.md, 2026-12-03), oneDNN's
kernel is 1.2-2.1x faster at 1-64 rows for weights of 2^18 entries and more with 2 threads, and 1.05-1.3x from
2^19 entries with 1 thread; below that its per-call overhead loses. A greedy decoding step of a GPT-2-small-sized
model got 1.46x faster at batch 1 and 8 with 2 threads. Training (gradients enabled), other devices and dtypes,
and layers under the size use ``F.linear`` unchanged. The two kernels agree to float32 rounding (relative
differences around 1e-6), not bit for bit.

Those measurements were on an AMD EPYC. On an Intel Xeon (Sapphire Rapids) MKL, Intel's own library, has the faster
GEMV: F.linear / oneDNN time 0.63-1.01 at 1-2 rows and 0.88-1.88 from 4 rows on GPT-2-small's weights, so on Intel
CPUs products of fewer than 4 rows (batch-1 and batch-2 decoding) keep F.linear (`benchmarks/linear_kernels.py`
measures both on a machine; docs/LOG.md, 2026-12-04).

``FULLBAND_ONEDNN=0`` in the environment turns it off; a torch build without the kernel falls back by itself.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from fullband.devices import cpu_vendor

# Entries from which oneDNN wins (module doc): with several threads, and with one.
ONEDNN_MIN_WEIGHT = {"threads": 1 << 18, "one_thread": 1 << 19}
# Rows from which oneDNN wins, by CPU vendor (module doc); 1 elsewhere.
ONEDNN_MIN_ROWS = {"GenuineIntel": 4}


def onednn_min_rows(vendor: str) -> int:
    """The fewest rows (tokens in the call) that go through oneDNN on a CPU of ``vendor`` (/proc/cpuinfo's name)."""
    return ONEDNN_MIN_ROWS.get(vendor, 1)


_onednn = os.environ.get("FULLBAND_ONEDNN", "1") != "0" and torch.backends.mkldnn.is_available()
_min_rows = onednn_min_rows(cpu_vendor())


def onednn_enabled() -> bool:
    """Whether large CPU float32 inference layers run through oneDNN in this process."""
    return _onednn


def set_onednn(enabled: bool) -> bool:
    """Turn the oneDNN inference kernel on or off (benchmarks compare both); returns the previous setting."""
    global _onednn
    previous, _onednn = _onednn, bool(enabled) and torch.backends.mkldnn.is_available()
    return previous


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        # Under torch.compile (the static decode step) inductor picks the kernel: the branch would break the graph.
        if _onednn and not torch.is_grad_enabled() and x.dtype == torch.float32 and x.device.type == "cpu" \
                and not torch.compiler.is_compiling() and w.dtype == torch.float32 and w.numel() >= _min_weight() \
                and x.numel() >= _min_rows * w.shape[1]:
            return _onednn_linear(x, w, self.bias)
        return F.linear(x, w, self.bias)


def _min_weight() -> int:
    return ONEDNN_MIN_WEIGHT["threads" if torch.get_num_threads() > 1 else "one_thread"]


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    global _onednn
    try:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    except (RuntimeError, AttributeError) as error:  # a torch build without it: plain matmul from now on
        _onednn = False
        warnings.warn(f"oneDNN linear unavailable ({error}); using F.linear", stacklevel=3)
        return F.linear(x, weight, bias)
