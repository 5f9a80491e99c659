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

Fused inference on a CPU (no gradients, outside torch.compile; :func:`cpu_inference`): a decoding step of at most
:data:`FUSE_MAX_ROWS` rows runs the products that read the same input as one, q/k/v and the MLP's gate/up, each
through one weight that concatenates theirs (:func:`product`), rotates q and k together in four ops
(:func:`fullband.model.layers.rotate`), and calls the projections as their weights' products, not as modules (no
module hooks run there). A GEMV reads its weight once either way; one longer product saves the kernel's per-call cost
and runs nearer the memory's speed, and at batch 1 each op's fixed cost is a visible share of a step.
Every such forward also normalises with torch's one-op RMSNorm and makes the additive attention mask once for all
blocks, which give the same numbers in fewer ops. The concatenated weight is a copy kept beside the parameters
(their names, checkpoints and the Llama conversion do not change): built on the first decoding step and again
whenever a weight was replaced or changed in place since (its storage or autograd version counter moved; a write
through ``.data`` moves neither: :func:`release_fused_weights` then), it costs the memory of those weights once more
while the model lives. A block that FSDP2 shards (``fully_shard``) never takes the fused path (:func:`fsdp_managed`):
FSDP gathers its weights into memory it frees after each use and writes them there without moving their version
counters, so after an optimizer step they can come back at the same address and a kept copy would pass for them.
``FULLBAND_FUSED_INFERENCE=0`` or :func:`set_fused_inference` turns all of it off.

A fused step of :data:`PACK_MIN_ROWS` to :data:`FUSE_MAX_ROWS` rows whose products oneDNN runs (batch decoding)
multiplies each block weight and the output head in oneDNN's layout packed for :data:`PACK_ROWS` rows
(:func:`product`): on an AMD EPYC 1.2-1.4x the plain layout's speed at 8-16 rows, and the same numbers bit for bit
from 2 rows with AVX-512 and AVX2 kernels (a single row gains nothing and rounds differently, so batch-1 steps keep
the plain layout; docs/LOG.md, 2026-12-07). The packed copies are kept and checked against the parameters as the
concatenated ones are, and cost the memory of those weights once more. ``FULLBAND_PACKED_WEIGHTS=0`` or
:func:`set_packed_weights` turns them off.

A decoding step that torch.compile traces on a CPU (the compiled static step, ``DecodeOptions.step = "compiled"``)
writes each float32 product of oneDNN's size without gradients (:func:`traced_decoding`) so that inductor runs it
well: a product of one row as a multiply-and-sum over the input, which inductor makes one vectorised kernel that
streams the weight (its own matrix-multiply lowering and oneDNN's GEMV read a one-row product's weight at about 55%
and 70% of a copy's bandwidth, the reduction at 75-90%), and a product of several rows through oneDNN's kernel as an
opaque op (:func:`onednn_product`; inductor's lowering of that op wants frozen weights). Batch-1 greedy decoding at
GPT-2-small dimensions then took 0.57-0.68 of the eager step's time on an AMD EPYC (docs/LOG.md, 2026-12-07).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence

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
        return linear(x, self.weight, self.bias)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` through the kernel :class:`Linear` picks for it (see the module doc)."""
    if takes_onednn(x, w):
        return _onednn_linear(x, w, bias)
    if traced_decoding(x, w):
        return _traced_product(x, w, bias)
    return F.linear(x, w, bias)


def takes_onednn(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`linear` multiplies ``x`` by ``w`` through oneDNN (see the module doc)."""
    # Under torch.compile (the static decode step) inductor picks the kernel: the branch would break the graph.
    return _onednn and not torch.is_grad_enabled() and x.dtype == torch.float32 and x.device.type == "cpu" \
        and not torch.compiler.is_compiling() and w.dtype == torch.float32 and w.numel() >= _min_weight() \
        and x.numel() >= _min_rows * w.shape[1]


def traced_decoding(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`linear` is traced by torch.compile for a CPU decoding step (the compiled static step): float32
    weights of oneDNN's size, no gradients, at most :data:`FUSE_MAX_ROWS` rows, fused inference on (module doc)."""
    return _fused and torch.compiler.is_compiling() and not torch.is_grad_enabled() and x.device.type == "cpu" \
        and x.dtype == torch.float32 and w.dtype == torch.float32 and x.numel() <= FUSE_MAX_ROWS * w.shape[1] \
        and w.numel() >= ONEDNN_MIN_WEIGHT["threads"]  # (torch.get_num_threads() stops a trace)


def _traced_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A traced decoding step's product (module doc): one row as a reduction, which inductor makes one kernel that
    streams the weight; several rows through oneDNN's kernel, kept opaque in the graph."""
    if x.numel() == w.shape[1]:
        out = (w * x.reshape(1, -1)).sum(-1).reshape(*x.shape[:-1], w.shape[0])
        return out if bias is None else out + bias
    if _onednn and x.numel() >= _min_rows * w.shape[1]:
        return onednn_product(x, w, bias)
    return F.linear(x, w, bias)


@torch.library.custom_op("fullband::onednn_product", mutates_args=(),
                         schema="(Tensor x, Tensor w, Tensor? bias) -> Tensor")  # (annotations are strings here)
def onednn_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear as an op inductor calls as it is (its own lowering of the op wants frozen weights)."""
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


@onednn_product.register_fake
def _(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[0]))


# ---------------------------------------------------------------- fused inference (decoding)

FUSE_MAX_ROWS = 16  # rows (tokens in the call) up to which decoding fuses products: batch-1..16 decoding steps
# Rows from which a fused step's products read oneDNN's packed layout, and the rows it is packed for (module doc).
PACK_MIN_ROWS, PACK_ROWS = 4, 8
_fused = os.environ.get("FULLBAND_FUSED_INFERENCE", "1") != "0"
_packing = os.environ.get("FULLBAND_PACKED_WEIGHTS", "1") != "0"
# owner module -> (the weights' storages and versions, their concatenation); weak, so a dropped model takes its copy
_FUSED: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.Tensor]] = weakref.WeakKeyDictionary()
# owner module -> {names: (their parameters' storages and versions, their weight in oneDNN's packed layout)}
_PACKED: weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, ...], tuple[tuple, torch.Tensor]]] = \
    weakref.WeakKeyDictionary()


def set_packed_weights(enabled: bool) -> bool:
    """Turn the packed layout of fused steps of :data:`PACK_MIN_ROWS` rows and more on or off (benchmarks compare
    both in one process); returns the previous setting. Packed copies already made are kept."""
    global _packing
    previous, _packing = _packing, bool(enabled)
    return previous


def packed_weights(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """:func:`set_packed_weights` for a block of code, the previous setting restored after it."""
    return _switched(set_packed_weights, enabled)


def packed_weights_enabled() -> bool:
    """Whether fused steps of several rows read packed weights in this process (see the module doc)."""
    return _packing


def fused_inference_enabled() -> bool:
    """Whether CPU inference takes the fused path in this process (see the module doc)."""
    return _fused


def set_fused_inference(enabled: bool) -> bool:
    """Turn the fused inference path on or off (benchmarks compare both in one process); returns the previous
    setting. The concatenated weights are kept (:func:`release_fused_weights` frees them)."""
    global _fused
    previous, _fused = _fused, bool(enabled)
    return previous


def fused_inference(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """:func:`set_fused_inference` for a block of code, the previous setting restored after it."""
    return _switched(set_fused_inference, enabled)


@contextlib.contextmanager
def _switched(setter: Callable[[bool], bool], enabled: bool) -> Iterator[None]:
    previous = setter(enabled)
    try:
        yield
    finally:
        setter(previous)


def cpu_inference(x: torch.Tensor) -> bool:
    """Whether ``x`` is in a CPU forward without gradients, outside torch.compile (inductor fuses what it compiles
    itself), with the decoding shortcuts on: the blocks then take the shortcuts that give the same numbers in fewer
    ops (one RMSNorm op, one attention mask for every block)."""
    return _fused and x.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling()


def fuses(x: torch.Tensor) -> bool:
    """Whether a product of ``x`` (..., in) runs fused: :func:`cpu_inference` with at most :data:`FUSE_MAX_ROWS`
    rows (decoding steps; a product of many rows gains nothing from it)."""
    return x.numel() <= FUSE_MAX_ROWS * x.shape[-1] and cpu_inference(x)


def fsdp_managed(module: nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) manages ``module``'s weights, which no kept copy may stand for (module doc)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: nothing is sharded, and the import stays unpaid
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def product(x: torch.Tensor, owner: nn.Module, names: Sequence[str]) -> torch.Tensor:
    """``x`` times the weights of ``owner``'s bias-free linear submodules ``names``, concatenated along their outputs
    (a kept copy; one name: its weight), as a fused decoding step runs it: from :data:`PACK_MIN_ROWS` rows,
    where oneDNN runs the product, through a kept copy of the weight in oneDNN's packed layout (module doc)."""
    weights = [weight_of(owner, name) for name in names]
    key = _key(weights)
    weight = _concatenated(owner, weights, key) if len(weights) > 1 else weights[0]
    if _packing and x.numel() >= PACK_MIN_ROWS * x.shape[-1] and takes_onednn(x, weight):
        packed = _packed(owner, tuple(names), key, weight)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return linear(x, weight)


def _key(weights: Sequence[torch.Tensor]) -> tuple:
    """What a kept copy of ``weights`` is checked against: their storages, versions and dtypes (a move to another
    device moves the storage). Always the parameters', never a copy's: a freed copy's address can come back."""
    return tuple((w.data_ptr(), w._version, w.dtype) for w in weights)


def _concatenated(owner: nn.Module, weights: Sequence[torch.Tensor], key: tuple) -> torch.Tensor:
    """``owner``'s ``weights`` (one input size) concatenated along their outputs, kept for ``owner`` and built again
    when any of them was replaced or changed in place since (``key`` moved: :func:`_key`)."""
    held = _FUSED.get(owner)
    if held is None or held[0] != key:
        with torch.no_grad():
            held = _FUSED[owner] = (key, torch.cat(weights))
    return held[1]


def _packed(owner: nn.Module, names: tuple[str, ...], key: tuple, weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (``owner``'s ``names``, whose parameters' :func:`_key` is ``key``) in oneDNN's layout packed for
    :data:`PACK_ROWS` rows, kept and packed again when ``key`` moved; None when this torch build cannot."""
    global _packing
    kept = _PACKED.setdefault(owner, {})
    held = kept.get(names)
    if held is None or held[0] != key:
        try:
            with torch.no_grad():
                held = kept[names] = (key, torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS))
        except (RuntimeError, AttributeError) as error:  # a build without it: the plain layout from now on
            _packing = False
            warnings.warn(f"oneDNN's packed weights unavailable ({error}); using the plain layout", stacklevel=3)
            return None
    return held[1]


def weight_of(owner: nn.Module, name: str) -> torch.Tensor:
    """``getattr(owner, name).weight`` by the modules' own tables: a decoding step reads every block's weights, and
    ``nn.Module.__getattr__`` costs about a microsecond a call, several times that between a step's GEMVs."""
    return owner._modules[name]._parameters["weight"]  # type: ignore[index]


def release_fused_weights(model: nn.Module) -> None:
    """Free the concatenated and packed weights of ``model``'s modules (after writing to its weights through
    ``.data``, which no check can see)."""
    for module in model.modules():
        _FUSED.pop(module, None)
        _PACKED.pop(module, None)


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
