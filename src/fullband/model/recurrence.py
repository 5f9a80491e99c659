"""The multi-pass (Jacobi) iteration of DESIGN.md §2, independent of the network that runs one pass.

A *pass* runs the whole stack over a chunk of positions in parallel. Pass 1 feeds plain token embeddings,
except at the chunk's first position when the state carried in from before the chunk is known. Pass k >= 2
shifts pass k-1's carried states right by one and fuses them into every position at or past ``plain_prefix``.
After k passes the first k-1 fused positions without a known predecessor are exact (see
:func:`exact_pass_count`). The native model and wrappers of other networks share this one loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100

PlainPrefix = int | torch.Tensor  # int, one value per row (B,), or per pass and row (K, B) (training only)
Stack = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # inputs u -> (carried h, head input)
Fuse = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (e_t, h_{t-1}) -> fused input
# e_t -> the input of a plain position in passes >= 2 (the paper's literal form normalises it there); None = e_t
PlainInput = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V) from the last pass (or its last logits_to_keep positions)
    hidden: torch.Tensor  # (B, T, D) carried states h_t from the last pass
    loss: torch.Tensor | None = None  # NTP(pass 1) + feedback_weight * mean_{k>=2} NTP(pass k)
    pass_losses: list[torch.Tensor] = field(default_factory=list)  # NTP loss of each pass
    passes: int = 1  # passes run (stack evaluations; summed over chunks for chunked/sequential)
    delta: torch.Tensor | None = None  # max |h^(k) - h^(k-1)| of the last pass, 0-d (None after one pass)


@dataclass
class Pass:
    """One pass of the loop: its number, its states and those of the pass before, and the head's input."""

    k: int  # passes run so far (1 = the plain pass)
    hidden: torch.Tensor  # (B, T, D) carried states h^(k)
    previous: torch.Tensor | None  # (B, T, D) h^(k-1); None after pass 1
    head_input: torch.Tensor  # (B, T, D) what the head turns into pass k's logits


@dataclass(frozen=True)
class LoopOptions:
    """How :func:`run_passes` runs and scores the loop: the forward's keyword arguments of the same names."""

    tol: float | None = None  # stop once max|h^(k) - h^(k-1)| < tol
    jitter: float = 0.0  # Uniform(-jitter, jitter) noise on the states about to be fused (training)
    detach_passes: bool = False  # no gradient through the states carried from one pass to the next
    feedback_weight: float = 1.0  # weight of the mean multi-pass loss against pass 1's
    logits_to_keep: int = 0  # without labels: logits of the last N positions only (0 = all)
    shift: int = 1  # 1: fuse h_{t-1} into t (the recurrence); 0: h_t (the looped control, DESIGN.md §7)
    grad_passes: int = 0  # m > 0: truncated gradients, pass 1 and the last m passes only (DESIGN.md §3)


def pass_loop(
    stack: Stack,
    fusion: Fuse | None,
    embed: Callable[[], torch.Tensor],  # () -> (B, T, D) token embeddings e_t
    fused: torch.Tensor,  # (B, T) bool: positions at or past plain_prefix; (K, B, T) for one per pass
    passes: int,
    *,
    carried_state: torch.Tensor | None = None,
    jitter: float = 0.0,
    detach_passes: bool = False,
    plain_input: PlainInput = None,
    shift: int = 1,
    grad_passes: int = 0,
    fixed_point: Callable[[], torch.Tensor] | None = None,
) -> Iterator[Pass]:
    """The one multi-pass loop: yield after each of up to ``passes`` passes (the caller may stop early).

    ``stack(u)`` runs the network once and returns (carried states, input of the head). ``plain_input`` maps the
    plain positions' embeddings in passes >= 2 (pass 1's stay raw).

    Truncated gradients (``grad_passes`` m > 0, DESIGN.md §3): passes 2 .. passes - m run without gradients, so
    pass 1 and the last m passes alone carry them. ``fixed_point()``, when given, stands in for those passes: the
    states (B, T, D) the recurrence converges to, computed without gradients (sequentially, faster on a CPU than
    whole-sequence passes), from which the last m passes start; each of them then embeds the tokens afresh
    (``embed()``), as the committed recurrent reports were trained (one shared embedding would sum the passes'
    gradients in another order and change their last digits).
    """
    first_grad = first_grad_pass(passes, grad_passes)
    restart = fixed_point if first_grad > 2 else None  # nothing to stand in for when every pass has gradients
    emb = embed()
    carried: torch.Tensor | None = None
    plain_later = None
    k = 1
    while k <= passes:
        if k == 2 and restart is not None:
            carried, k = restart(), first_grad
        # Entered and left within the pass: a context held across the yield would leak into the caller.
        with torch.set_grad_enabled(torch.is_grad_enabled() and (k == 1 or k >= first_grad)):
            if restart is not None and k > 1:
                emb = embed()
                plain_later = plain_input(emb) if plain_input is not None else None
            elif k == 2 and plain_input is not None:
                plain_later = plain_input(emb)
            fused_k = fused[min(k, fused.shape[0]) - 1] if fused.dim() == 3 else fused  # (B, T): per-pass prefixes
            inputs = pass_inputs(fusion, emb, fused_k, carried, carried_state, jitter, detach_passes, plain_later,
                                 shift)
            new_carried, head_input = stack(inputs)
        yield Pass(k, new_carried, carried, head_input)
        carried = new_carried
        k += 1


def first_grad_pass(passes: int, grad_passes: int) -> int:
    """The first pass after pass 1 that runs with gradients: ``passes - grad_passes + 1``, or 2 when all do."""
    return max(2, passes - grad_passes + 1) if grad_passes > 0 else 2


def truncation(plain_prefix: PlainPrefix, T: int, passes: int, grad_passes: int) -> tuple[int, bool]:
    """How a batch of length ``T`` with truncated gradients (``grad_passes`` > 0) runs ``passes`` > 1 passes:
    (the passes it runs, whether its gradient passes start from the fixed point).

    It runs at most its exact count (later passes cannot change a state), and starts the passes with gradients from
    the recurrence's fixed point when the passes reach that count, some run without gradients, and every row has
    the one plain prefix the sequential fixed point takes (a prefix per pass, (K, B), has none). Data-parallel
    training decides this on a step's global batch, so that every process runs what one process would.
    """
    exact = exact_pass_count(plain_prefix, T, 0, False)
    passes = min(passes, exact)
    one_prefix = not isinstance(plain_prefix, torch.Tensor) or (
        plain_prefix.dim() == 1 and plain_prefix.unique().numel() == 1)
    return passes, passes == exact and first_grad_pass(passes, grad_passes) > 2 and one_prefix


def run_passes(
    stack: Stack,
    head: Callable[[torch.Tensor], torch.Tensor],
    fusion: Fuse | None,
    embed: Callable[[], torch.Tensor],  # () -> (B, T, D) token embeddings e_t
    fused: torch.Tensor,  # (B, T) bool: positions at or past plain_prefix; (K, B, T) for one per pass
    passes: int,
    *,
    labels: torch.Tensor | None = None,
    carried_state: torch.Tensor | None = None,
    options: LoopOptions = LoopOptions(),
    plain_input: PlainInput = None,
    fixed_point: Callable[[], torch.Tensor] | None = None,
) -> LMOutput:
    """Run :func:`pass_loop` for up to ``passes`` passes; stop early once ``max|h^(k) - h^(k-1)| < options.tol``.

    ``head`` gives logits. With ``labels`` every pass with gradients is scored (every pass unless
    ``options.grad_passes`` > 0), otherwise only the last pass. The loss is the multi-pass objective of DESIGN.md §3
    over the scored passes: NTP(pass 1) + feedback_weight * mean of the others' NTP.
    """
    tol, logits_to_keep = options.tol, options.logits_to_keep
    first_grad = first_grad_pass(passes, options.grad_passes)
    pass_losses: list[torch.Tensor] = []
    delta: torch.Tensor | None = None
    logits = None
    step = None
    for step in pass_loop(stack, fusion, embed, fused, passes, carried_state=carried_state, jitter=options.jitter,
                          detach_passes=options.detach_passes, plain_input=plain_input, shift=options.shift,
                          grad_passes=options.grad_passes, fixed_point=fixed_point):
        last = step.k == passes
        if step.previous is not None:
            delta = (step.hidden - step.previous).detach().abs().max()
            # Only a tolerance needs the value on the host; otherwise no sync with the device.
            last = last or (tol is not None and delta.item() < tol)
        if labels is not None and (step.k == 1 or step.k >= first_grad):
            logits = head(step.head_input)
            pass_losses.append(ntp_loss(logits, labels))
        elif last:
            logits = head(step.head_input[:, -logits_to_keep:] if logits_to_keep else step.head_input)
        if last:
            break
    loss = None
    if pass_losses:
        loss = pass_losses[0]
        if len(pass_losses) > 1:
            loss = loss + options.feedback_weight * torch.stack(pass_losses[1:]).mean()
    return LMOutput(logits=logits, hidden=step.hidden, loss=loss, pass_losses=pass_losses, passes=step.k,
                    delta=delta)


def pass_inputs(
    fusion: Fuse | None,
    emb: torch.Tensor,  # (B, T, D)
    fused: torch.Tensor,  # (B, T)
    carried: torch.Tensor | None,  # (B, T, D) previous pass's states; None in pass 1
    carried_state: torch.Tensor | None,  # (B, D) state carried in from before the chunk
    jitter: float = 0.0,
    detach: bool = False,
    plain: torch.Tensor | None = None,  # (B, T, D) plain positions' inputs in passes >= 2; None = emb
    shift: int = 1,
) -> torch.Tensor:
    """Input vectors of one pass: fuse(e_t, h_{t-1}) at fused positions whose h_{t-1} is known, else e_t (or
    ``plain`` in passes >= 2).

    ``shift`` 0 is the looped control (DESIGN.md §7): fuse(e_t, h_t) from the previous pass, so no state moves
    along the sequence (a carried-in state has no meaning there and is ignored)."""
    if fusion is None or (carried is None and (carried_state is None or shift == 0)):
        return emb  # pass 1 of a chunk with nothing carried in: all plain
    if shift == 0:
        own = carried.detach() if detach else carried
        return torch.where(fused[..., None], fusion(emb, _jittered(own, jitter)), emb if plain is None else plain)
    B, _, D = emb.shape
    incoming = carried_state if carried_state is not None else emb.new_zeros(B, D)
    if carried is None:
        # Pass 1: only the chunk's first position has a known predecessor, the carried-in state.
        first = fusion(emb[:, 0], _jittered(incoming, jitter))
        return torch.cat((torch.where(fused[:, :1], first, emb[:, 0])[:, None], emb[:, 1:]), dim=1)
    prev = carried.detach() if detach else carried
    prev_states = _jittered(torch.cat((incoming[:, None], prev[:, :-1]), dim=1), jitter)  # h_{t-1} at t
    fuse_here = fused.clone()
    if carried_state is None:
        fuse_here[:, 0] = False  # no predecessor for the chunk's first position
    return torch.where(fuse_here[..., None], fusion(emb, prev_states), emb if plain is None else plain)


def _jittered(states: torch.Tensor, jitter: float) -> torch.Tensor:
    # Training-time robustness noise on the states about to be fused (DESIGN.md §3).
    return states + torch.empty_like(states).uniform_(-jitter, jitter) if jitter > 0 else states


def ntp_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy; ``labels`` are aligned with the inputs and shifted here (-100 = ignore)."""
    logits = logits[:, :-1].flatten(0, 1)
    # Cross-entropy in at least float32, so bf16 logits do not lose the loss's precision.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)


def fused_positions(plain_prefix: PlainPrefix, B: int, T: int, offset: int, device: torch.device) -> torch.Tensor:
    """(B, T) bool: which positions of a chunk starting at absolute position ``offset`` are past the prefix
    ((K, B, T) for a (K, B) prefix per pass)."""
    absolute = torch.arange(offset, offset + T, device=device)
    if isinstance(plain_prefix, torch.Tensor):
        if plain_prefix.dim() == 2 and plain_prefix.shape[1] == B:  # (K, B): a prefix per pass -> (K, B, T)
            return torch.stack([fused_positions(row, B, T, offset, device) for row in plain_prefix])
        if plain_prefix.shape != (B,):
            raise ValueError(f"plain_prefix tensor must have shape ({B},) or (passes, {B}), got "
                             f"{tuple(plain_prefix.shape)}")
        # Checked where it is read for free: on a CUDA tensor it would make the host wait for the GPU every forward
        # (the Trainer draws its prefixes >= 1 on the host and copies them over without waiting).
        if plain_prefix.device.type == "cpu" and bool((plain_prefix < 1).any()):
            raise ValueError("plain_prefix must be >= 1 in every row (position 1 is always plain)")
        return absolute[None, :] >= plain_prefix.to(device)[:, None]
    if not isinstance(plain_prefix, int) or plain_prefix < 1:
        raise ValueError(f"plain_prefix must be an integer >= 1 (position 1 is always plain), got {plain_prefix!r}")
    return (absolute >= plain_prefix)[None, :].expand(B, T)


def exact_pass_count(plain_prefix: PlainPrefix, T: int, offset: int, has_incoming: bool) -> int:
    """Passes after which every position of a chunk is exact.

    After pass k the first k-1 fused positions lacking a known predecessor are exact (each pass fixes one
    more), so the count is (fused positions) + 1, one fewer when the chunk's first position is fused with a
    known incoming state.
    """
    prefix = int(plain_prefix.min()) if isinstance(plain_prefix, torch.Tensor) else int(plain_prefix)
    n_fused = max(0, offset + T - max(prefix, offset))
    first_known = has_incoming and offset >= prefix
    return max(1, n_fused + 1 - int(first_known))


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
