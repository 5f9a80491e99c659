"""Speculative decoding with latent feedback (DESIGN.md §4), exact in every decoding mode.

Each round starts from the decoding state (KV cache up to position L, the carried state ``h_{L-1}``) and the
*pending* token ``c`` at position L, already drawn from the target's distribution. A drafter proposes ``gamma``
tokens ``d_1..d_gamma``; the target verifies the block ``[c, d_1..d_gamma]`` at positions ``L..L+gamma``.

Without feedback (``standard`` mode) one parallel pass over the block is exact. With feedback (soft, fused, exact
modes: the prefills differ, decoding is the same) the input at block position i is ``fuse(e_i, h_{i-1})`` with
``h_{i-1}`` the target's own state one position earlier, so verification runs the Jacobi iteration of DESIGN.md §2
over the block: pass 1 fuses ``c`` with the carried state and feeds the drafts plainly, pass k fuses the states of
pass k-1. After pass k, block positions ``0..k-1`` are exact, so the logits judging ``d_1..d_k`` are exact; the
iteration stops at the first rejection it can prove (or when the states stop changing at all, a fixed point). It
needs one pass per accepted token plus one, and never more than ``gamma + 1``.

The round keeps the accepted prefix ``c, d_1..d_a``: the keys/values of the last pass at those positions came from
exact inputs, so committing them leaves the cache as plain decoding would, and the carried state becomes the
target's exact state at the last kept position. The next token (``d_{a+1}`` if accepted, a correction otherwise,
or a bonus token after a fully accepted block) becomes the next pending token.

Greedy: a draft is accepted when it is the target's argmax. Sampling: the standard rejection rule (accept ``d`` with
probability ``min(1, p(d)/q(d))``, else draw from ``norm(max(0, p - q))``), so every emitted token follows the
target's distribution. A batch advances by its rows' shortest accepted prefix (rows that stopped do not count).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from fullband.config import validate_speculative_options
from fullband.generation.drafters import Drafter, Sampler, make_drafter
from fullband.generation.sampling import is_greedy, token_probs
from fullband.generation.state import DecodeState
from fullband.model import FeedbackLM
from fullband.modes import DecodeOptions

GREEDY = DecodeOptions()  # the sampling settings of greedy decoding


@dataclass
class SpeculativeConfig:
    """How to decode speculatively: the drafter, and how many tokens it drafts per verification."""

    drafter: str | FeedbackLM = "standard"  # "standard" | "early_exit" | "early_exit:N" | a model with the vocab
    gamma: int = 4  # tokens drafted per round (the start value when adaptive)
    adaptive: bool = False  # +1 after a fully accepted block, -1 after a rejection, within 1..max_gamma
    max_gamma: int = 16

    def __post_init__(self) -> None:
        validate_speculative_options(self.drafter, self.gamma, self.max_gamma)


@dataclass
class SpeculativeStats:
    """Counters over the rounds of one decode (a batch counts once per round: its shortest accepted prefix)."""

    rounds: int = 0  # verifications: one target call each (of one or more passes)
    drafted: int = 0  # tokens proposed
    accepted: int = 0  # proposed tokens kept
    emitted: int = 0  # tokens the rounds produced (accepted + the correction or bonus)
    passes: int = 0  # target passes over draft blocks (stack evaluations)
    fixed_points: int = 0  # verifications that ended because the block's states stopped changing
    per_round: list[tuple[int, int, int]] = field(default_factory=list)  # (drafted, accepted, passes)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def passes_per_verification(self) -> float:
        return self.passes / self.rounds if self.rounds else 0.0


class SpeculativeDecoder:
    """Runs the rounds of the module docstring for one batch; ``stats`` counts what they did."""

    def __init__(
        self,
        model: FeedbackLM,
        config: SpeculativeConfig,
        options: DecodeOptions = GREEDY,
        generator: torch.Generator | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        """``options``: the sampling settings the tokens follow (the mode is the prefill's, already run)."""
        self.model, self.config = model, config
        self.drafter = drafter if drafter is not None else make_drafter(config.drafter, model)
        self.temperature, self.top_k, self.top_p = options.temperature, options.top_k, options.top_p
        self.greedy = is_greedy(options.temperature)  # the sampler's rule, as plain decoding's
        self.generator = generator
        self.gamma = config.gamma
        self.stats = SpeculativeStats()
        # Diagnostic (None = off; costs one head call per pass): per round, the first pass whose argmax tokens at
        # the kept positions already equal the exact ones (what a non-exact, tolerance-stopped verifier would need).
        self.settle_passes: list[int] | None = None

    # ------------------------------------------------------------------ sampling helpers

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        return token_probs(logits, self.temperature, self.top_k, self.top_p)

    def _draw(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def _sampler(self) -> Sampler:
        if self.greedy:
            return lambda logits: (logits.argmax(-1), None)

        def sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            probs = self._probs(logits)
            return self._draw(probs), probs

        return sample

    def first_token(self, state: DecodeState) -> torch.Tensor:
        if self.greedy:
            return state.next_logits.argmax(-1)
        return self._draw(self._probs(state.next_logits))

    # ------------------------------------------------------------------ one round

    @torch.no_grad()
    def round(self, state: DecodeState, seq: torch.Tensor, gamma: int, active: torch.Tensor,
              stops: torch.Tensor, pad: int) -> tuple[torch.Tensor, int]:
        """One draft + verification from ``seq`` (B, n): every token so far, the pending one last.

        Commits the pending token and the accepted drafts to ``state``; returns the tokens that follow the pending
        one (B, a + 1), the last of which is the new pending token, and ``a``.
        """
        B = seq.shape[0]
        pending = seq[:, -1]
        if gamma > 0:
            drafts, draft_probs = self.drafter.propose(seq, gamma, self._sampler())
            drafts = torch.where(active[:, None], drafts, pad)  # stopped rows feed pads, as plain decoding does
        else:
            drafts, draft_probs = seq.new_zeros(B, 0), None
        block = torch.cat((pending[:, None], drafts), 1)  # (B, gamma + 1)
        T = block.shape[1]
        # A row's drafts after its first stop token are not fed: cap what it may accept there.
        cap = torch.full((B,), gamma, dtype=torch.long, device=block.device)
        if gamma > 0:
            is_stop = torch.isin(drafts, stops) & active[:, None]
            cap = torch.where(is_stop.any(1), is_stop.long().argmax(1) + 1, cap)

        logits = None  # (B, n_exact, V) the exact logits so far
        accept = torch.zeros(B, 0, dtype=torch.bool, device=block.device)  # (B, verified drafts)
        uniform = torch.rand(B, gamma, generator=self.generator, device=block.device, dtype=torch.float64) \
            if not self.greedy and gamma > 0 else None
        feedback = state.carried is not None
        step, pass_tokens = None, []
        for step in self.model.iterate_passes(block, T if feedback else 1, state.prompt_len, cache=state.cache,
                                              carried_state=state.carried, attention_mask=torch.ones_like(block)):
            if self.settle_passes is not None:
                pass_tokens.append(self.model.lm_head(step.head_input).argmax(-1))
            fixed_point = step.previous is not None and torch.equal(step.hidden, step.previous)
            self.stats.fixed_points += int(fixed_point and step.k < T)
            n_exact = T if not feedback or fixed_point else step.k  # pass k makes block positions < k exact
            done = logits.shape[1] if logits is not None else 0
            new = self.model.lm_head(step.head_input[:, done:n_exact])
            logits = torch.cat((logits, new), 1) if logits is not None else new
            verified = min(n_exact, gamma)
            if verified > accept.shape[1]:
                judged = torch.arange(accept.shape[1], verified, device=block.device)
                accept = torch.cat((accept, self._accepts(logits, drafts, draft_probs, uniform, judged)), 1)
            leading = accept.long().cumprod(1).sum(1)  # accepted drafts before the first rejection
            per_row = torch.minimum(leading, cap)
            if bool((per_row[active] < verified).any()) or n_exact >= gamma:
                break
        # The batch keeps its rows' shortest accepted prefix, never more than the exact positions allow.
        a = min(int(per_row[active].min()) if bool(active.any()) else gamma, n_exact - 1)
        if self.settle_passes is not None:
            exact = logits[:, : a + 1].argmax(-1)
            self.settle_passes.append(next(k for k, tokens in enumerate(pass_tokens, 1)
                                           if torch.equal(tokens[:, : a + 1], exact)))
        state.cache.commit(torch.ones_like(block[:, : a + 1], dtype=torch.bool))
        state.carried = step.hidden[:, a] if feedback else None
        state.next_logits = logits[:, a]
        following = self._next_token(logits[:, a], drafts, draft_probs, per_row, a, gamma)
        self.drafter.rollback(seq.shape[1] + a)
        # With feedback a fully accepted block keeps its last draft as the next pending token (its bonus token
        # would need one more pass): it counts as accepted.
        all_accepted = gamma > 0 and bool((per_row[active] >= gamma).all())
        self._count(gamma, gamma if all_accepted else a, a + 1, step.k)
        return torch.cat((drafts[:, :a], following[:, None]), 1), a

    def _accepts(self, logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                 uniform: torch.Tensor | None, judged: torch.Tensor) -> torch.Tensor:
        """Whether each draft d_{i+1}, i in ``judged``, passes, from the exact logits at block position i."""
        target = logits[:, judged]  # (B, n, V)
        chosen = drafts[:, judged]  # (B, n)
        if self.greedy:
            return target.argmax(-1) == chosen
        p = self._probs(target.flatten(0, 1)).view_as(target).gather(-1, chosen[..., None]).squeeze(-1)
        q = draft_probs[:, judged].gather(-1, chosen[..., None]).squeeze(-1)
        return uniform[:, judged] * q < p  # u < p/q, without dividing (q > 0: d was drawn from q)

    def _next_token(self, logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                    per_row: torch.Tensor, a: int, gamma: int) -> torch.Tensor:
        """The token after the kept prefix (B,): the draft where the row accepted it, else a correction (or the
        bonus token after a fully accepted block)."""
        if self.greedy:
            return logits.argmax(-1)
        p = self._probs(logits)
        if a == gamma:
            return self._draw(p)
        residual = (p - draft_probs[:, a]).clamp(min=0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)  # p == q never rejects
        corrected = self._draw(residual)
        return torch.where(per_row > a, drafts[:, a], corrected)

    def _count(self, gamma: int, accepted: int, emitted: int, passes: int) -> None:
        s = self.stats
        s.rounds += 1
        s.drafted += gamma
        s.accepted += accepted
        s.emitted += emitted
        s.passes += passes
        s.per_round.append((gamma, accepted, passes))
        if self.config.adaptive and gamma > 0:
            self.gamma = min(self.config.max_gamma, self.gamma + 1) if accepted == gamma else max(1, self.gamma - 1)

    # ------------------------------------------------------------------ the stream

    def stream(self, state: DecodeState, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
               stop_token_ids: Sequence[int] = (), pad_token_id: int | None = None) -> Iterator[torch.Tensor]:
        """Yield each row's next token (B,) as plain :func:`~fullband.generation.decoding.stream` does, from a
        state :func:`~fullband.generation.decoding.prefill` returned for ``ids``/``mask``."""
        device = ids.device
        self.drafter.start(ids, mask, ids.shape[1] + max_new_tokens)
        stops = torch.tensor(list(stop_token_ids), dtype=torch.long, device=device)
        pad = pad_token_id if pad_token_id is not None else (int(stops[0]) if len(stops) else 0)
        finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
        seq, emitted, following = ids, 0, self.first_token(state)[:, None]
        while True:
            for column in following.unbind(1):
                token = torch.where(finished, torch.full_like(column, pad), column)
                yield token
                emitted += 1
                finished |= torch.isin(token, stops)
                if bool(finished.all()) or emitted == max_new_tokens:
                    return
            seq = torch.cat((seq, token[:, None]), 1)  # the pending token (a pad in stopped rows)
            # A round emits up to gamma + 1 tokens: never draft past max_new_tokens.
            gamma = min(self.gamma, max_new_tokens - emitted - 1)
            following, a = self.round(state, seq, gamma, ~finished, stops, pad)
            seq = torch.cat((seq, following[:, :a]), 1)


def speculative_stream(
    model: FeedbackLM,
    state: DecodeState,
    ids: torch.Tensor,
    mask: torch.Tensor,
    max_new_tokens: int,
    speculative: SpeculativeConfig | dict,
    options: DecodeOptions,
    generator: torch.Generator | None,
) -> Iterator[torch.Tensor]:
    """What ``stream(..., speculative=...)`` runs after the prefill."""
    config = speculative if isinstance(speculative, SpeculativeConfig) else SpeculativeConfig(**speculative)
    decoder = SpeculativeDecoder(model, config, options, generator)
    yield from decoder.stream(state, ids, mask, max_new_tokens, options.stop_token_ids, options.pad_token_id)
