"""Instruction-tuning data: JSONL in, ``(input_ids, labels)`` examples out, prompt tokens masked.

Each non-blank line of the file is one JSON object, either

- ``{"prompt": str, "completion": str}``: ``input_ids = enc(prompt) + enc(completion) + [eos]``, no
  template (put any separator you want in the strings), or
- ``{"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}``, rendered with the
  plain-text chat template below. At least one assistant turn is required.

Chat template (plain text, so it works with any tokenizer, including bytes)::

    <|system|>\\n{content}\\n          masked
    <|user|>\\n{content}\\n            masked
    <|assistant|>\\n                   masked
    {content}<eos>                    trained on
    ... next turn ...

``labels`` is aligned with ``input_ids`` (the model shifts internally) and is ``IGNORE_INDEX`` (-100)
wherever the loss must not apply: prompts, non-assistant turns, role headers, padding. Segments are
tokenized separately so the masked/trained boundary is exact and matches what a prompt built with
``encode_chat(..., add_generation_prompt=True)`` looks like at inference time. Examples longer than
``max_len`` are cut from the right; an example left with no trained token is skipped with a warning.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from fullband.data.errors import DataError
from fullband.data.shards import rank_slice
from fullband.data.tokenizer import Tokenizer

IGNORE_INDEX = -100
ROLES = ("system", "user", "assistant")


class SFTExample(NamedTuple):
    input_ids: list[int]
    labels: list[int]


def role_header(role: str) -> str:
    return f"<|{role}|>\n"


def encode_prompt_completion(tokenizer: Tokenizer, prompt: str, completion: str) -> SFTExample:
    """Prompt masked, completion and eos trained on."""
    p, c = tokenizer.encode(prompt), [*tokenizer.encode(completion), tokenizer.eos_id]
    return SFTExample(p + c, [IGNORE_INDEX] * len(p) + c)


def encode_chat(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
) -> SFTExample:
    """Render ``messages`` with the chat template; only assistant contents (+ eos) are trained on.

    ``add_generation_prompt`` appends the assistant header, giving the prompt to generate a reply from.
    """
    ids: list[int] = []
    labels: list[int] = []

    def add(tokens: list[int], train: bool) -> None:
        ids.extend(tokens)
        labels.extend(tokens if train else [IGNORE_INDEX] * len(tokens))

    for m in messages:
        if m["role"] == "assistant":
            add(tokenizer.encode(role_header("assistant")), train=False)
            add([*tokenizer.encode(m["content"]), tokenizer.eos_id], train=True)
        else:
            add(tokenizer.encode(role_header(m["role"]) + m["content"] + "\n"), train=False)
    if add_generation_prompt:
        add(tokenizer.encode(role_header("assistant")), train=False)
    return SFTExample(ids, labels)


def _check_record(obj: Any, where: str) -> Any:
    """Validate one parsed line; DataError messages start with ``file:line``."""
    if isinstance(obj, dict) and "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: 'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise DataError(
                    f'{where}: messages[{i}] must be {{"role": one of {", ".join(ROLES)}, '
                    f'"content": string}}, got {json.dumps(m)[:80]}'
                )
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError(f"{where}: 'messages' has no assistant turn, so nothing to train on")
        return msgs
    if isinstance(obj, dict) and "prompt" in obj and "completion" in obj:
        if not (isinstance(obj["prompt"], str) and isinstance(obj["completion"], str)):
            raise DataError(f"{where}: 'prompt' and 'completion' must be strings")
        return obj
    raise DataError(f"{where}: expected an object with 'prompt' and 'completion' or with 'messages'")


def load_sft(path: str | Path, tokenizer: Tokenizer, max_len: int) -> list[SFTExample]:
    """Read and encode a JSONL instruction file (see module doc), truncating examples to ``max_len``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"SFT data file not found: {path}")
    if max_len < 2:
        raise DataError(f"max_len must be at least 2, got {max_len}")
    examples: list[SFTExample] = []
    skipped = 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = _check_record(json.loads(line), where)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e
            ex = (
                encode_chat(tokenizer, rec)
                if isinstance(rec, list)
                else encode_prompt_completion(tokenizer, rec["prompt"], rec["completion"])
            )
            ex = SFTExample(ex.input_ids[:max_len], ex.labels[:max_len])
            if all(lab == IGNORE_INDEX for lab in ex.labels):
                skipped += 1
                continue
            examples.append(ex)
    if skipped:
        warnings.warn(f"{path}: skipped {skipped} example(s) whose prompt fills all of max_len={max_len}", stacklevel=2)
    if not examples:
        raise DataError(f"{path}: no usable examples")
    return examples


def collate_sft(examples: Sequence[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest example: ``(input_ids, labels)`` LongTensor[B, T]; padded labels are -100.

    Right padding keeps every real token at the same position as unpadded, so a causal model needs
    no attention mask to give the padded rows the same loss.
    """
    if not examples:
        raise DataError("collate_sft got an empty batch")
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids, dtype=torch.long)
        labels[row, : len(e.labels)] = torch.tensor(e.labels, dtype=torch.long)
    return ids, labels


class SFTBatches:
    """Random SFT batches reproducible from ``(seed, step)``, with the same interface as ``TokenBatches``."""

    def __init__(self, examples: Sequence[SFTExample], batch_size: int, pad_id: int, seed: int = 0,
                 curriculum_steps: int = 0) -> None:
        if not examples:
            raise DataError("SFTBatches needs at least one example")
        if batch_size < 1:
            raise DataError(f"batch_size must be positive, got {batch_size}")
        self.examples, self.batch_size, self.pad_id, self.seed = list(examples), batch_size, pad_id, seed
        self.curriculum_steps = curriculum_steps

    def pool(self, step: int) -> int:
        """How many examples (a prefix of the file) ``step`` draws from: a curriculum grows it linearly from
        ``batch_size`` to all of them over ``curriculum_steps`` (the file's order is the difficulty order)."""
        if step >= self.curriculum_steps:
            return len(self.examples)
        share = math.ceil(len(self.examples) * step / self.curriculum_steps)
        return min(len(self.examples), max(self.batch_size, share))

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous slice of the global batch drawn for ``step``."""
        picks = np.random.default_rng([self.seed, step]).integers(0, self.pool(step), size=self.batch_size)
        mine = picks[rank_slice(self.batch_size, rank, world_size)]
        return collate_sft([self.examples[i] for i in mine], self.pad_id)
