"""Drafters for speculative decoding: cheap guesses of the target's next tokens.

Every drafter here is a network decoded in ``standard`` mode (plain inputs, no carried state to wait for) with its
own KV cache, rolled back to the accepted prefix after each verification:

- ``"standard"``: the target itself over the same weights, without feedback;
- ``"early_exit"`` / ``"early_exit:N"``: the target's first N blocks (default half) and its own final norm and
  head, a reduced-depth guess of the target (shares the target's weights, no copy);
- a model object: any network with the target's vocabulary (a small baseline trained on the same tokenizer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from fullband.model import FeedbackLM, FullBandwidthLM

DRAFTER_NAMES = ("standard", "early_exit", "early_exit:N")

# logits (B, V) -> (tokens (B,), probabilities (B, V) they were drawn from, or None when greedy)
Sampler = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


class Drafter(Protocol):
    """What the speculative decoder asks of a drafter."""

    vocab_size: int

    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_len: int) -> None: ...

    def propose(self, seq: torch.Tensor, gamma: int, sample: Sampler) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def rollback(self, kept: int) -> None: ...


class ModelDrafter:
    """Drafts with ``model`` in standard mode, keeping its KV cache in step with the accepted tokens."""

    def __init__(self, model: FeedbackLM, name: str = "model") -> None:
        self.model = model
        self.name = name
        self.cache = None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @torch.no_grad()
    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_len: int) -> None:
        """Prefill the (left-padded) prompt (B, T) plainly into a fresh cache of ``max_len`` slots."""
        if max_len > self.model.config.max_seq_len:
            raise ValueError(f"the drafter's context max_seq_len={self.model.config.max_seq_len} is shorter than "
                             f"prompt + max_new_tokens = {max_len}; use a drafter with a longer context or generate "
                             "fewer tokens")
        self.cache = self.model.new_cache(ids.shape[0], max_len)
        self.model(ids, cache=self.cache, attention_mask=mask, logits_to_keep=1)

    @torch.no_grad()
    def propose(self, seq: torch.Tensor, gamma: int, sample: Sampler) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``gamma`` tokens after ``seq`` (B, n): every token so far, the not yet verified one last.

        Returns tokens (B, gamma) and, when sampling, the drafter's probabilities (B, gamma, V) they came from.
        """
        new = seq[:, self.cache.length :]  # what the drafter has not seen yet (at least the last token)
        tokens, probs = [], []
        for _ in range(gamma):
            logits = self.model(new, cache=self.cache, attention_mask=torch.ones_like(new)).logits[:, -1]
            token, p = sample(logits)
            tokens.append(token)
            probs.append(p)
            new = token[:, None]
        drafts = torch.stack(tokens, 1)
        return drafts, (torch.stack(probs, 1) if probs[0] is not None else None)

    def rollback(self, kept: int) -> None:
        """Keep the first ``kept`` tokens of the sequence (the ones the target accepted)."""
        self.cache.truncate(min(kept, self.cache.length))


def early_exit_model(target: FullBandwidthLM, n_layers: int) -> FullBandwidthLM:
    """The target's first ``n_layers`` blocks, input norm, final norm and head as a plain network (no copy)."""
    if not isinstance(target, FullBandwidthLM):
        raise ValueError(f"the early_exit drafter needs a native FullBandwidthLM target, got {type(target).__name__}")
    if not 1 <= n_layers < target.config.n_layers:
        raise ValueError(f"early_exit:{n_layers} is invalid: the target has {target.config.n_layers} blocks, so "
                         f"use early_exit:N with N in 1..{target.config.n_layers - 1}")
    config = dataclasses.replace(target.config, n_layers=n_layers, feedback=False, feedback_source="residual",
                                 feedback_target=0)
    with torch.device("meta"):  # a shell: every module is replaced by the target's own below
        shell = FullBandwidthLM(config)
    shell.embed, shell.input_norm, shell.norm, shell.lm_head = target.embed, target.input_norm, target.norm, \
        target.lm_head
    shell.blocks = nn.ModuleList(list(target.blocks)[:n_layers])
    shell.inv_freq = target.inv_freq
    return shell.eval()


def is_drafter_name(spec: str) -> bool:
    """A built-in drafter's name (anything else on the command line is a checkpoint directory)."""
    return spec == "standard" or spec == "early_exit" or spec.startswith("early_exit:")


def make_drafter(spec: str | FeedbackLM, target: FeedbackLM) -> ModelDrafter:
    """A drafter from its name (see the module docstring) or a model, checked against the target's vocabulary."""
    if isinstance(spec, FeedbackLM):
        drafter = ModelDrafter(spec, name=f"model({type(spec).__name__})")
    elif spec == "standard":
        drafter = ModelDrafter(target, name="standard")
    elif isinstance(spec, str) and is_drafter_name(spec):
        count = spec.partition(":")[2]
        if count and not count.isdigit():
            raise ValueError(f"drafter={spec!r} is invalid: write early_exit:N with N a number of blocks")
        n = int(count) if count else max(1, target.config.n_layers // 2)
        drafter = ModelDrafter(early_exit_model(target, n), name=f"early_exit:{n}")
    else:
        raise ValueError(f"drafter={spec!r} is invalid: use one of {DRAFTER_NAMES} or a model object (on the command "
                         "line, a checkpoint directory)")
    if drafter.vocab_size != target.config.vocab_size:
        raise ValueError(f"the drafter's vocab_size={drafter.vocab_size} differs from the target's "
                         f"{target.config.vocab_size}: a drafter must share the target's tokenizer")
    return drafter
