"""Decoding in the four inference modes of DESIGN.md §4, batched with left padding, streaming.

The decoding state of a row is its KV cache plus the last carried state ``h``. Every mode decodes one token
per step through the model's one forward; the modes differ in how the prompt is prefilled and whether the
carried state is fed back:

- ``standard``: plain prefill, plain decoding (an ordinary transformer);
- ``soft``: plain prefill, fused decoding from the first generated token on;
- ``fused:k``: the prompt gets ``k`` extra fused passes (Jacobi, p = 1), then fused decoding;
- ``exact``: the prompt is fully recurrent (sequential, or exact Jacobi per chunk), then fused decoding.

A mode is parsed once into a :class:`~fullband.modes.DecodingMode`; nothing here names one: its registered prefill
(:func:`~fullband.modes.prefill_of`, a :class:`~fullband.modes.Prefill`) says what it does with the prompt and
whether decoding feeds the carried state back, so a mode added to the registry decodes here unchanged. Greedy or
sampled is the sampler's decision (:func:`~fullband.generation.sampling.is_greedy`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from fullband.config import is_int, require
from fullband.generation.looped import check_looped_options, is_looped, looped_stream
from fullband.generation.sampling import sample_next
from fullband.generation.speculative import SpeculativeConfig, speculative_stream
from fullband.generation.state import DecodeState
from fullband.generation.static import static_decoder, supports_static
from fullband.model import FeedbackLM, FullBandwidthLM
from fullband.model.kv_cache import CacheSlots
from fullband.modes import DECODING_MODES, DEFAULT_MODE, DecodeOptions, DecodingMode, Prefill, prefill_of, torch_seed

MODES = DECODING_MODES  # the built-in modes (fullband.modes.mode_names() lists the registered ones)

PromptInput = torch.Tensor | Sequence[int] | Sequence[Sequence[int]]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged prompts -> (ids (B, T), attention_mask (B, T)), padded on the left."""
    if len(prompts) == 0 or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), T), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, T - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, T - len(prompt) :] = 1
    return ids, mask


def _as_batch(prompt_ids: PromptInput, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids[None] if prompt_ids.dim() == 1 else prompt_ids
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError("prompt_ids must be a non-empty tensor of shape (seq_len,) or (batch, seq_len)")
        mask = attention_mask if attention_mask is not None else torch.ones_like(ids)
        mask = mask[None] if mask.dim() == 1 else mask
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask shape {tuple(mask.shape)} != prompt_ids shape {tuple(ids.shape)}")
        if not bool(mask[:, -1].all()):
            raise ValueError("prompts must be left-padded: the last position of every row must be a real token")
        return ids.long(), mask.long()
    if len(prompt_ids) > 0 and isinstance(prompt_ids[0], int):
        return left_pad([prompt_ids])  # type: ignore[list-item]
    return left_pad(prompt_ids)  # type: ignore[arg-type]


@torch.no_grad()
def prefill(
    model: FullBandwidthLM,
    ids: torch.Tensor,  # (B, T) left-padded prompt
    mask: torch.Tensor,  # (B, T)
    mode: str | DecodingMode | Prefill,
    max_len: int,
    exact_chunk_size: int = 1,
    exact_tol: float | None = None,
    cache: CacheSlots | None = None,
) -> DecodeState:
    """Run the prompt through the model in ``mode`` (or as a :class:`~fullband.modes.Prefill` says: the server runs
    the prefill that arrivals of several modes share) and return the state to decode from. ``cache``: an empty cache
    of at least ``max_len`` slots to fill (a static decoder's), else a new one."""
    plan = mode if isinstance(mode, Prefill) else prefill_of(DecodingMode.parse(mode))
    B, T = ids.shape
    if max_len > model.config.max_seq_len:
        raise ValueError(f"prompt ({T} tokens, padded) + max_new_tokens = {max_len} exceeds the model context "
                         f"max_seq_len={model.config.max_seq_len}; shorten the prompt or generate fewer tokens")
    cache = cache if cache is not None else model.new_cache(B, max_len)
    # With left padding, a row's first real token is the one that must stay plain (p = 1 in that row).
    first_real = (mask.shape[1] - mask.sum(dim=1)).to(ids.device)
    if plan.exact:
        out = model.prefill(ids, cache, first_real + 1, chunk_size=exact_chunk_size, tol=exact_tol,
                            attention_mask=mask)
    elif plan.passes == 1:
        out = model(ids, passes=1, cache=cache, attention_mask=mask, logits_to_keep=1)
    else:
        out = model(ids, passes=plan.passes, plain_prefix=first_real + 1, cache=cache, attention_mask=mask,
                    logits_to_keep=1)
    carried = out.hidden[:, -1] if plan.carries and model.fusion is not None else None
    return DecodeState(cache=cache, carried=carried, next_logits=out.logits[:, -1], prompt_len=T)


@torch.no_grad()
def decode_step(model: FullBandwidthLM, state: DecodeState, tokens: torch.Tensor) -> None:
    """Feed the chosen tokens (B,) and advance ``state`` by one position."""
    if state.plain_rows is None and state.cache.length >= max(state.prompt_len, 1):  # all rows fused or none
        out = model.decode_token(tokens, state.cache, state.carried)
    else:
        ones = torch.ones(tokens.shape[0], 1, dtype=torch.long, device=tokens.device)
        plain_prefix: int | torch.Tensor = state.prompt_len
        if state.plain_rows is not None:  # a plain row's prefix lies past every position the cache can hold
            plain_prefix = torch.where(state.plain_rows, state.cache.max_len + 1, max(state.prompt_len, 1))
        out = model(tokens[:, None], plain_prefix=plain_prefix, cache=state.cache, carried_state=state.carried,
                    attention_mask=ones)
    state.next_logits = out.logits[:, -1]
    if state.carried is not None:
        state.carried = out.hidden[:, -1]


@torch.no_grad()
def decode(
    model: FeedbackLM,
    prompt_ids: PromptInput,
    max_new_tokens: int,
    options: DecodeOptions,
    *,
    attention_mask: torch.Tensor | None = None,
    exact_tol: float | None = None,
    speculative: SpeculativeConfig | dict | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row (B,) at each step, decoding as ``options`` say; rows that hit a stop token
    yield the pad id.

    Stops after ``max_new_tokens`` steps or when every row has stopped. ``speculative`` (a
    :class:`~fullband.generation.speculative.SpeculativeConfig` or its fields as a dict) drafts and verifies several
    tokens per target call; the tokens are the same (greedy) or follow the same distribution (sampling).
    """
    require(is_int(max_new_tokens) and max_new_tokens >= 0, "max_new_tokens", max_new_tokens,
            "must be an integer >= 0")
    mode = options.decoding_mode
    device = model.embed.weight.device
    ids, mask = _as_batch(prompt_ids, attention_mask)
    ids, mask = ids.to(device), mask.to(device)
    if max_new_tokens == 0:
        return
    generator = torch.Generator(device=device).manual_seed(torch_seed(options.seed)) \
        if options.seed is not None else None
    if is_looped(model):  # no recurrence along the sequence: whole-sequence passes per token (generation.looped)
        check_looped_options(mode, speculative)
        if mode.feeds_back:
            yield from looped_stream(model, ids, mask, max_new_tokens, options, generator)
            return
    length = ids.shape[1] + max_new_tokens
    static = None
    if options.step != "eager" and speculative is None and supports_static(model):  # else: the eager step
        static = static_decoder(model, ids.shape[0], length, compiled=options.step == "compiled")
    state = prefill(model, ids, mask, mode, length, exact_chunk_size=options.exact_chunk_size, exact_tol=exact_tol,
                    cache=static.fresh_cache() if static is not None else None)
    advance = static.step if static is not None else lambda state, token: decode_step(model, state, token)
    if speculative is not None:
        yield from speculative_stream(model, state, ids, mask, max_new_tokens, speculative, options, generator)
        return
    stops = torch.tensor(options.stop_token_ids, dtype=torch.long, device=device)
    pad = pad_id(options)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        token = sample_next(state.next_logits, options.temperature, options.top_k, options.top_p, generator)
        if stops.numel():  # only a stop id finishes a row
            token = torch.where(finished, torch.full_like(token, pad), token)
        yield token
        if stops.numel():  # without stop ids no row finishes: no read of the device per token (a CUDA sync)
            finished |= torch.isin(token, stops)
            if bool(finished.all()):
                return
        if step == max_new_tokens - 1:
            return
        advance(state, token)


def pad_id(options: DecodeOptions) -> int:
    """What a stopped row yields: ``pad_token_id``, else the first stop id, else 0."""
    if options.pad_token_id is not None:
        return options.pad_token_id
    return options.stop_token_ids[0] if options.stop_token_ids else 0


def stream(
    model: FeedbackLM,
    prompt_ids: PromptInput,
    max_new_tokens: int = 64,
    mode: str | DecodingMode = DEFAULT_MODE,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop_token_ids: Sequence[int] = (),
    pad_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,
    exact_chunk_size: int = 1,
    exact_tol: float | None = None,
    speculative: SpeculativeConfig | dict | None = None,
    step: str = "eager",
) -> Iterator[torch.Tensor]:
    """:func:`decode` with the :class:`~fullband.modes.DecodeOptions` given one by one. ``mode`` is spelled as a
    user types it (``fused:2``) or a parsed :class:`~fullband.modes.DecodingMode`."""
    options = DecodeOptions(mode=mode, exact_chunk_size=exact_chunk_size, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, stop_token_ids=tuple(stop_token_ids), pad_token_id=pad_token_id,
                            step=step)
    return decode(model, prompt_ids, max_new_tokens, options, attention_mask=attention_mask, exact_tol=exact_tol,
                  speculative=speculative)


def generate(
    model: FullBandwidthLM,
    prompt_ids: PromptInput,
    max_new_tokens: int = 64,
    mode: str | DecodingMode = DEFAULT_MODE,
    **kwargs,
) -> torch.Tensor | list[int] | list[list[int]]:
    """Prompt + generated tokens.

    A tensor prompt (T,) or (B, T) returns a tensor (B, T + n) padded with the pad id after a stop; a list of
    ids returns a list, a list of lists returns a list of lists, each cut after its first stop token.
    """
    steps = list(stream(model, prompt_ids, max_new_tokens, mode, **kwargs))
    return _with_prompts(prompt_ids, steps, kwargs.get("attention_mask"), set(kwargs.get("stop_token_ids", ())))


def _with_prompts(prompt_ids: PromptInput, steps: list[torch.Tensor], attention_mask: torch.Tensor | None,
                  stops: set[int]) -> torch.Tensor | list[int] | list[list[int]]:
    """What :func:`generate` returns: the prompts with the tokens of ``steps`` after them."""
    ids, mask = _as_batch(prompt_ids, attention_mask)
    new = torch.stack(steps, dim=1).cpu() if steps else torch.zeros(ids.shape[0], 0, dtype=torch.long)
    if isinstance(prompt_ids, torch.Tensor):
        return torch.cat((ids.cpu(), new), dim=1)
    rows = []
    for row in range(ids.shape[0]):
        prompt = ids[row][mask[row].bool()].tolist()
        generated: list[int] = []
        for token in new[row].tolist():
            generated.append(token)
            if token in stops:
                break
        rows.append(prompt + generated)
    single = len(prompt_ids) > 0 and isinstance(prompt_ids[0], int)
    return rows[0] if single else rows

