"""The multi-pass (Jacobi) iteration of DESIGN.md §2, independent of the network that runs one pass.

A *pass* runs the blocks above the feedback target over a chunk of positions in parallel, from the *target stream*
(what enters block ``target + 1`` at a plain position: the token embeddings at target 0), which the blocks below
compute once. Pass 1 feeds the plain stream, except at the chunk's first position when the state carried in from
before the chunk is known. Pass k >= 2 shifts pass k-1's carried states right by one and fuses them into every
position the plan fuses (:func:`fused_positions`). After k passes every position before the k-th fused position is
exact (see :func:`exact_passes`). The native model and wrappers of other networks share this one loop; the training
objective drives it one pass at a time (``fullband.training.objective``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100

PlainPrefix = int | torch.Tensor  # int, one value per row (B,), or per pass and row (K, B) (training)
Stack = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # inputs u -> (carried h, head input)
Fuse = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (z_t, h_{t-1}) -> fused input
# z_t -> the input of a plain position in passes >= 2 (the paper's literal form normalises it there); None = z_t
PlainInput = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V) from the last pass (or its last logits_to_keep positions)
    hidden: torch.Tensor  # (B, T, D) carried states h_t from the last pass
    passes: int = 1  # passes run (stack evaluations; summed over chunks for chunked/sequential)
    delta: torch.Tensor | None = None  # max |h^(k) - h^(k-1)| of the last pass, 0-d (None after one pass)
    # (B, T, D) the plain stream at the feedback target (the token embeddings at target 0): what a later forward over
    # the same tokens may take back (``target_stream=``) instead of running the blocks below the target again
    target_stream: torch.Tensor | None = None


@dataclass
class Pass:
    """One pass of the loop: its number, its states and those of the pass before, and the head's input."""

    k: int  # passes run so far (1 = the plain pass, or the first pass from given per-position states)
    hidden: torch.Tensor  # (B, T, D) carried states h^(k)
    previous: torch.Tensor | None  # (B, T, D) h^(k-1); None after the loop's first pass
    head_input: torch.Tensor  # (B, T, D) what the head turns into pass k's logits


def pass_loop(
    stack: Stack,
    fusion: Fuse | None,
    stream: torch.Tensor,  # (B, T, D) the plain target stream z^k_t (token embeddings at target 0)
    fused: torch.Tensor,  # (B, T) bool: positions that receive feedback (fused_positions); (K, B, T) for one per pass
    passes: int,
    *,
    carried_state: torch.Tensor | None = None,
    plain_input: PlainInput = None,
    shift: int = 1,
) -> Iterator[Pass]:
    """The one multi-pass loop: yield after each of up to ``passes`` passes (the caller may stop early).

    ``stack(u)`` runs the blocks above the target once and returns (carried states, input of the head).
    ``carried_state``: (B, D) the state entering the chunk's first position, or (B, T, D) the states the loop's first
    pass fuses into each position (h_{t-1} at t, a position's own h_t with ``shift`` 0): the loop then continues a
    Jacobi iteration from them, as the training objective runs its passes one at a time. ``plain_input`` maps the
    plain positions' stream in passes after the plain one (pass 1's stays raw).
    """
    per_position = carried_state is not None and carried_state.dim() == 3
    incoming = None if per_position else carried_state
    carried: torch.Tensor | None = None
    plain_later = None
    for k in range(1, passes + 1):
        fused_k = fused[min(k, fused.shape[0]) - 1] if fused.dim() == 3 else fused  # (B, T): a plan per pass
        if (k == 2 or (k == 1 and per_position)) and plain_input is not None:
            plain_later = plain_input(stream)
        if k == 1 and per_position:
            inputs = fuse_into(fusion, stream, fused_k, carried_state, plain_later)
        else:
            inputs = pass_inputs(fusion, stream, fused_k, carried, incoming, plain_later, shift)
        new_carried, head_input = stack(inputs)
        yield Pass(k, new_carried, carried, head_input)
        carried = new_carried


def run_passes(
    stack: Stack,
    head: Callable[[torch.Tensor], torch.Tensor],
    fusion: Fuse | None,
    stream: torch.Tensor,  # (B, T, D) the plain target stream
    fused: torch.Tensor,  # (B, T) bool, or (K, B, T) for one plan per pass
    passes: int,
    *,
    carried_state: torch.Tensor | None = None,
    tol: float | None = None,
    logits_to_keep: int = 0,
    plain_input: PlainInput = None,
    shift: int = 1,
) -> LMOutput:
    """Run :func:`pass_loop` for up to ``passes`` passes; stop early once ``max|h^(k) - h^(k-1)| < tol``. ``head``
    gives the last pass's logits (of its last ``logits_to_keep`` positions; 0 = all)."""
    delta: torch.Tensor | None = None
    step = None
    for step in pass_loop(stack, fusion, stream, fused, passes, carried_state=carried_state,
                          plain_input=plain_input, shift=shift):
        last = step.k == passes
        if step.previous is not None:
            delta = (step.hidden - step.previous).detach().abs().max()
            # Only a tolerance needs the value on the host; otherwise no sync with the device.
            last = last or (tol is not None and delta.item() < tol)
        if last:
            break
    logits = head(step.head_input[:, -logits_to_keep:] if logits_to_keep else step.head_input)
    return LMOutput(logits=logits, hidden=step.hidden, passes=step.k, delta=delta, target_stream=stream)


def pass_inputs(
    fusion: Fuse | None,
    stream: torch.Tensor,  # (B, T, D) the plain target stream
    fused: torch.Tensor,  # (B, T)
    carried: torch.Tensor | None,  # (B, T, D) previous pass's states; None in pass 1
    carried_state: torch.Tensor | None,  # (B, D) state carried in from before the chunk
    plain: torch.Tensor | None = None,  # (B, T, D) plain positions' inputs in passes >= 2; None = stream
    shift: int = 1,
) -> torch.Tensor:
    """Input vectors of one pass at the target: fuse(z_t, h_{t-1}) at fused positions whose h_{t-1} is known, else
    z_t (or ``plain`` in passes >= 2).

    ``shift`` 0 is the looped control (DESIGN.md §7): fuse(z_t, h_t) from the previous pass, so no state moves
    along the sequence (a carried-in state has no meaning there and is ignored)."""
    if fusion is None or (carried is None and (carried_state is None or shift == 0)):
        return stream  # pass 1 of a chunk with nothing carried in: all plain
    if shift == 0:
        return fuse_into(fusion, stream, fused, carried, plain)
    if carried is None:
        # Pass 1: only the chunk's first position has a known predecessor, the carried-in state.
        first = fusion(stream[:, 0], carried_state)
        return torch.cat((torch.where(fused[:, :1], first, stream[:, 0])[:, None], stream[:, 1:]), dim=1)
    fuse_here = fused.clone()
    if carried_state is None:
        fuse_here[:, 0] = False  # no predecessor for the chunk's first position
    return fuse_into(fusion, stream, fuse_here, shifted_states(carried, carried_state), plain)


def shifted_states(carried: torch.Tensor, incoming: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, D) h_{t-1} at position t: a pass's states ``carried`` (B, T, D) moved right by one, ``incoming`` (B, D)
    (zeros when None: a position without a predecessor is never fused) at the first position."""
    B, _, D = carried.shape
    incoming = incoming if incoming is not None else carried.new_zeros(B, D)
    return torch.cat((incoming[:, None], carried[:, :-1]), dim=1)


def fuse_into(fusion: Fuse | None, stream: torch.Tensor, fused: torch.Tensor, states: torch.Tensor,
              plain: torch.Tensor | None = None) -> torch.Tensor:
    """fuse(z_t, states_t) where ``fused`` (B, T) says, else z_t (or ``plain``); ``states`` (B, T, D) is what each
    position fuses (h_{t-1} at t)."""
    if fusion is None:
        return stream
    return torch.where(fused[..., None], fusion(stream, states), stream if plain is None else plain)


def ntp_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy; ``labels`` are aligned with the inputs and shifted here (-100 = ignore)."""
    logits = logits[:, :-1].flatten(0, 1)
    # Cross-entropy in at least float32, so bf16 logits do not lose the loss's precision.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)


def fused_positions(plain_prefix: PlainPrefix, B: int, T: int, offset: int, device: torch.device,
                    fused: torch.Tensor | None = None) -> torch.Tensor:
    """The plan of a chunk starting at absolute position ``offset``: (B, T) bool, the positions that receive feedback
    ((K, B, T) for a plan per pass). A position is fused when it lies past the plain prefix (absolute positions
    counted from 0 against ``plain_prefix``: an int, (B,) per row or (K, B) per pass and row) and, if given, where
    ``fused`` (B, T) or (K, B, T) (bool, chunk positions) says. The sequence's first position is always plain."""
    prefix = _prefix_positions(plain_prefix, B, T, offset, device)
    if fused is None:
        return prefix
    if not isinstance(fused, torch.Tensor) or fused.dtype != torch.bool or fused.shape[-2:] != (B, T) \
            or fused.dim() not in (2, 3):
        shape = tuple(fused.shape) if isinstance(fused, torch.Tensor) else type(fused).__name__
        raise ValueError(f"fused must be a bool tensor of shape ({B}, {T}) or (passes, {B}, {T}), got {shape}")
    fused = fused.to(device)
    if offset == 0:  # position 1 has no predecessor
        fused = torch.cat((torch.zeros_like(fused[..., :1]), fused[..., 1:]), dim=-1)
    if prefix.dim() == 3 and fused.dim() == 3 and prefix.shape[0] != fused.shape[0]:
        raise ValueError(f"a plain prefix per pass ({prefix.shape[0]} passes) and a fused plan per pass "
                         f"({fused.shape[0]} passes) must give the same number of passes")
    return prefix & fused


def _prefix_positions(plain_prefix: PlainPrefix, B: int, T: int, offset: int, device: torch.device) -> torch.Tensor:
    absolute = torch.arange(offset, offset + T, device=device)
    if isinstance(plain_prefix, torch.Tensor):
        if plain_prefix.dim() == 2 and plain_prefix.shape[1] == B:  # (K, B): a prefix per pass -> (K, B, T)
            return torch.stack([_prefix_positions(row, B, T, offset, device) for row in plain_prefix])
        if plain_prefix.shape != (B,):
            raise ValueError(f"plain_prefix tensor must have shape ({B},) or (passes, {B}), got "
                             f"{tuple(plain_prefix.shape)}")
        # Checked where it is read for free: on a CUDA tensor it would make the host wait for the GPU every forward
        # (the Trainer draws its prefixes >= 1 on the host and copies them over without waiting).
        if plain_prefix.device.type == "cpu" and bool((plain_prefix < 1).any()):
            raise ValueError("plain_prefix must be >= 1 in every row (position 1 is always plain)")
        return absolute[None, :] >= plain_prefix.to(device)[:, None]
    if not isinstance(plain_prefix, int) or isinstance(plain_prefix, bool) or plain_prefix < 1:
        raise ValueError(f"plain_prefix must be an integer >= 1 (position 1 is always plain), got {plain_prefix!r}")
    return (absolute >= plain_prefix)[None, :].expand(B, T)


def restart_at(starts: torch.Tensor) -> torch.Tensor:
    """The plan (B, T) bool that keeps the positions ``starts`` (B, T) plain and fuses every other one: a packed row
    whose documents each restart the recurrence (``starts``: each document's first token)."""
    return ~starts.bool()


def exact_pass_count(plain_prefix: PlainPrefix, T: int, offset: int, has_incoming: bool) -> int:
    """Passes after which every position of a chunk with a plain prefix is exact: (fused positions) + 1, one fewer
    when the chunk's first position is fused with a known incoming state (:func:`exact_passes` for any plan)."""
    prefix = int(plain_prefix.min()) if isinstance(plain_prefix, torch.Tensor) else int(plain_prefix)
    n_fused = max(0, offset + T - max(prefix, offset))
    first_known = has_incoming and offset >= prefix
    return max(1, n_fused + 1 - int(first_known))


def exact_passes(fused: torch.Tensor, has_incoming: bool) -> int:
    """Passes after which every position of a chunk with the plan ``fused`` ((B, T), or (K, B, T): the longest) is
    exact: each pass makes one more fused position exact, so a row needs its fused positions + 1, one fewer when its
    first position is fused from a known incoming state (DESIGN.md §2)."""
    rows = fused.flatten(0, -2) if fused.dim() == 3 else fused  # (rows, T)
    count = rows.sum(dim=1) + 1
    if has_incoming:
        count = count - rows[:, 0].long()
    return max(1, int(count.max()))


def auto_exact_method(device: torch.device, tol: float | None) -> str:
    """The exact method ``forward_exact(method="auto")`` runs: ``sequential``, except ``chunked`` on a CUDA device
    when a tolerance ``tol`` lets each chunk stop early.

    Why (``fullband bench``, its exact rows; docs/LOG.md): solved to exactness, chunked and Jacobi cannot beat
    sequential anywhere, since chunked needs one pass per position of each chunk (T forward calls, as sequential,
    each over more positions) and Jacobi T - p + 1 passes over the whole window. With a tolerance they stop early,
    but each pass runs every position again: on a CPU, where time follows FLOPs, 4 x 256 tokens of a trained
    compare-default model took 2.2x sequential's time by chunked(32), 2.0x by chunked(32) to 1e-4 and 3.0x by
    Jacobi to 1e-4 (61 passes). On a GPU a sequential step is bound by kernel launches rather than FLOPs, so
    fewer, wider calls should win: chunked on CUDA is a hypothesis for benchmarks/gpu_check.py to confirm, not a
    measurement.
    """
    return "chunked" if device.type == "cuda" and tol else "sequential"
