"""lm-evaluation-harness adapter: ``lm_eval --model fullband --model_args pretrained=DIR,mode=soft``.

Importing this module registers the model name ``fullband`` with lm-eval. Model arguments:

- ``pretrained`` (required): a directory written by ``save_pretrained`` / ``fullband train`` (``.../model``),
  native or retrofitted, or ``hf:PATH`` (a transformers model, retrofitted on load); text is tokenized with the
  tokenizer saved there (``tokenizer_config.json``).
- ``mode``: a registered mode's spelling, ``standard | soft | fused:K | exact`` (default ``standard``).
- ``temperature``, ``top_k``, ``top_p``, ``seed``: how ``generate_until`` samples where a task does not say (a task's
  ``do_sample`` / ``temperature`` win; default greedy), as ``fullband eval``'s [decode] section.
- ``exact_chunk_size`` (1 = sequential) and ``exact_tol``: how the exact parts are computed (see below).
- ``batch_size`` (default 16; ``auto`` means the default), ``device`` (default cpu), ``dtype``
  (``float32 | float64 | bfloat16``), ``max_gen_toks`` (default 256), ``progress`` (tqdm bars, default true).

**Which positions are plain and which fused.** ``loglikelihood(context, continuation)`` tokenizes the pair as
lm-eval's HF model does (trailing spaces of the context move to the continuation; an empty context becomes the
end-of-text token). The model reads ``c_1..c_n x_1..x_{m-1}`` and scores ``x_1..x_m``:

==========  ===================================================  ==========================================
mode        context c_1..c_n                                     continuation inputs x_1..x_{m-1}
==========  ===================================================  ==========================================
standard    all plain, one pass                                  all plain
soft        all plain, one pass                                  all fused, exact recurrence from h(c_n)
fused:k     c_1 plain, c_2..c_n fused, ``1 + k`` Jacobi passes    all fused, exact recurrence from that h(c_n)
exact       c_1 plain, c_2..c_n fused, exact                     all fused, exact recurrence
==========  ===================================================  ==========================================

That is the log-probability that greedy decoding in the same mode (``fullband generate --decode.mode M``) assigns
to the continuation when it is teacher-forced; "exact" parts are sequential through the KV cache (or exact
Jacobi chunks of ``exact_chunk_size``). ``loglikelihood_rolling`` uses lm-eval's disjoint rolling windows of
``max_seq_len`` tokens, each scored as a (context, continuation) pair by the table above (the first window's
context is the end-of-text token). ``generate_until`` decodes in ``mode`` with the same prefill, stopping at
end-of-text, at any ``until`` string (cut off) or after ``max_gen_toks``.

A checkpoint trained without feedback gives identical results in every mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm.auto import tqdm

from fullband.config import ConfigError
from fullband.data import Tokenizer
from fullband.evaluation.continuation import score_continuations
from fullband.families import load_any, load_tokenizer_of
from fullband.generation.decoding import decode
from fullband.modes import DEFAULT_SCORE_MODE, DecodeOptions

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
DEFAULT_BATCH_SIZE = 16


@register_model("fullband")
class FullbandLM(LM):
    """A fullband checkpoint as an lm-eval model (see the module docstring for the modes)."""

    def __init__(
        self,
        pretrained: str,
        mode: str = DEFAULT_SCORE_MODE,
        prefill_passes: int | None = None,  # retired: refused naming mode=fused:K
        exact_chunk_size: int = 1,
        exact_tol: float | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        max_batch_size: int | None = None,
        device: str | None = "cpu",
        dtype: str = "float32",
        max_gen_toks: int = 256,
        progress: bool = True,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ConfigError(f"dtype={dtype!r} is invalid: must be one of {tuple(DTYPES)}")
        if prefill_passes is not None:
            raise ConfigError(f"prefill_passes={prefill_passes!r} is retired: the pass count is part of the mode, "
                              "mode=fused:K (e.g. fused:2)", "prefill_passes")
        # the mode and the sampling settings of generate_until
        self.decode = DecodeOptions(mode=mode, exact_chunk_size=exact_chunk_size, temperature=temperature, top_k=top_k,
                                    top_p=top_p, seed=seed, stop_token_ids=tuple(stop_token_ids))
        tokenizer = load_tokenizer_of(pretrained)
        if tokenizer is None:
            raise ConfigError(f"pretrained={pretrained!r} has no saved tokenizer (tokenizer_config.json); "
                              "lm-eval needs one to turn text into ids")
        self.tokenizer: Tokenizer = tokenizer
        self._device = torch.device(device or "cpu")
        self.model = load_any(pretrained, device=self._device, dtype=DTYPES[dtype])  # any family, as its spec loads it
        self.mode = self.decode.decoding_mode
        self.exact_chunk_size, self.exact_tol = exact_chunk_size, exact_tol
        self.batch_size = _batch_size(batch_size, max_batch_size)
        self.max_gen_toks, self.progress = max_gen_toks, progress

    @property
    def max_length(self) -> int:
        return self.model.config.max_seq_len

    @property
    def tokenizer_name(self) -> str:
        return f"fullband-{self.tokenizer.fingerprint[:16]}"

    # ------------------------------------------------------------------ loglikelihood

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        pairs = [self._encode_pair(*req.args) for req in requests]
        results = self._score(pairs, "loglikelihood")
        for req, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        windows, owner = [], []
        for i, req in enumerate(requests):
            tokens = self.tokenizer.encode(req.args[0])
            for window in get_rolling_token_windows(tokens, self.tokenizer.eos_id, self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._score(windows, "loglikelihood_rolling"), strict=True):
            totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # As lm-eval's HF model: a trailing space belongs to the continuation (BPE merges it into the next word).
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        context_ids = self.tokenizer.encode(context)
        continuation_ids = whole[len(context_ids) :]
        return context_ids or [self.tokenizer.eos_id], continuation_ids

    def _score(self, pairs: Sequence[tuple[list[int], list[int]]], what: str) -> list[tuple[float, bool]]:
        """Score token pairs in batches of similar length; results in the order of ``pairs``."""
        pairs = [self._truncate(context, continuation) for context, continuation in pairs]
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        for batch in self._batches(order, f"{what} ({self.mode})"):
            scored = score_continuations(
                self.model, [pairs[i] for i in batch], self.mode, exact_chunk_size=self.exact_chunk_size,
                exact_tol=self.exact_tol,
            )
            for i, result in zip(batch, scored, strict=True):
                results[i] = result
        return results

    def _truncate(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """Cut the context from the left so that the model's input (context + continuation[:-1]) fits."""
        if len(continuation) > self.max_length:
            raise ValueError(f"a continuation of {len(continuation)} tokens exceeds the model context "
                             f"max_seq_len={self.max_length}")
        keep = max(1, self.max_length + 1 - len(continuation))
        return context[-keep:], continuation

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests: list[Any]) -> list[str]:
        results: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):  # one decoding configuration per group
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], self.max_gen_toks)
            until = [kwargs["until"]] if isinstance(kwargs["until"], str) else list(kwargs["until"] or [])
            max_new = int(kwargs["max_gen_toks"])
            given = requests[indices[0]].args[1]
            temperature = ((float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0)
                           if "do_sample" in given or "temperature" in given else self.decode.temperature)
            prompts = [self._prompt(requests[i].args[0], max_new) for i in indices]
            order = sorted(range(len(indices)), key=lambda j: -len(prompts[j]))
            for batch in self._batches(order, f"generate_until ({self.mode})"):
                texts = self._generate([prompts[j] for j in batch], until, max_new, temperature)
                for j, text in zip(batch, texts, strict=True):
                    results[indices[j]] = text
        for req, text in zip(requests, results, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return results

    def _prompt(self, context: str, max_new: int) -> list[int]:
        if max_new >= self.max_length:
            raise ValueError(f"max_gen_toks={max_new} must be below the model context max_seq_len={self.max_length}")
        ids = self.tokenizer.encode(context) or [self.tokenizer.eos_id]
        return ids[-(self.max_length - max_new) :]  # keep the end of a long prompt

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], until: list[str], max_new: int, temperature: float) -> list[str]:
        eos = self.tokenizer.eos_id
        generated: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        options = dataclasses.replace(self.decode, temperature=temperature,
                                      stop_token_ids=(eos, *self.decode.stop_token_ids))
        steps = decode(self.model, prompts, max_new, options, exact_tol=self.exact_tol)
        for step in steps:
            for row, token in enumerate(step.tolist()):
                if done[row]:
                    continue
                if token == eos:
                    done[row] = True
                    continue
                generated[row].append(token)
                # Stop strings can span tokens, so look at the decoded text; only its tail can hold a new match.
                done[row] = _cut(self.tokenizer.decode(generated[row][-64:]), until) is not None
            if all(done):
                break  # closing the stream early saves the remaining steps
        return [_cut(text, until) or text for text in (self.tokenizer.decode(g) for g in generated)]

    # ------------------------------------------------------------------ helpers

    def _batches(self, order: list[int], desc: str) -> Iterator[list[int]]:
        starts = range(0, len(order), self.batch_size)
        for start in tqdm(starts, desc=desc, disable=not self.progress, leave=False):
            yield order[start : start + self.batch_size]


def _cut(text: str, until: Sequence[str]) -> str | None:
    """``text`` up to its first stop string, or None when it holds none."""
    hits = [text.index(stop) for stop in until if stop and stop in text]
    return text[: min(hits)] if hits else None


def _batch_size(batch_size: int | str | None, max_batch_size: int | None) -> int:
    if batch_size in (None, "auto") or (isinstance(batch_size, str) and batch_size.startswith("auto")):
        return max_batch_size or DEFAULT_BATCH_SIZE  # no memory probing on CPU: a fixed size
    size = int(batch_size)
    if size < 1:
        raise ConfigError(f"batch_size={batch_size!r} is invalid: must be an integer >= 1 or 'auto'")
    return size
