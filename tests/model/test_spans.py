"""The recurrence span and per-token plans (DESIGN.md §1-§2, issue 53): for any span (source layer s, target k < s)
and any plan of fused positions, every way of computing the recurrence gives the from-the-formula sequential states
(conftest's ``span_reference``), the blocks below the target run once per position, impossible spans are refused, and
the default span gives the numbers the code gave before spans existed, bit for bit."""

import random
from pathlib import Path

import pytest
import torch
from conftest import make_model, span_reference
from safetensors.torch import load_file

from fullband import FullBandwidthLM, ModelConfig, generate
from fullband.config import ConfigError
from fullband.model import exact_passes, fused_positions
from fullband.training import MultiPassObjective
from fullband.training.objective import document_plan

TOL = 1e-9
FIXTURE = Path(__file__).parent / "fixtures" / "default_span"

# (n_layers, feedback_source, feedback_target): the full-bandwidth default, a T2MLR-style middle span, an LRT-style
# middle source into the embedding, the normed top into a middle stream, a span that ends below the top
SPANS = [(2, "residual", 0), (4, "layer:3", 1), (3, "layer:2", 0), (3, "normed", 2), (5, "layer:4", 2)]


def random_spans(count: int, seed: int) -> list[tuple[int, str, int]]:
    """``count`` spans drawn at random (a fixed seed): any depth 2..5, any source, any target below it."""
    rng = random.Random(seed)
    spans = []
    for _ in range(count):
        L = rng.randint(2, 5)
        s = rng.randint(1, L)
        source = rng.choice(["residual", "normed"]) if s == L else f"layer:{s}"
        spans.append((L, source, rng.randint(0, s - 1)))
    return spans


def span_model(span, seed=0, **overrides) -> FullBandwidthLM:
    L, source, target = span
    return make_model(seed, n_layers=L, feedback_source=source, feedback_target=target, **overrides)


def random_plan(B: int, T: int, seed: int, plain_share: float = 0.3) -> torch.Tensor:
    """(B, T) bool: a plan with plain positions scattered inside each row (position 1 plain)."""
    fused = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) > plain_share
    fused[:, 0] = False
    return fused


def decode_token_by_token(model, tokens, fused):
    """Exact KV-cache decoding, one position at a time, each fused where the plan says: the carried state of the
    previous position goes in with every token."""
    cache = model.new_cache(*tokens.shape)
    out = model(tokens[:, :1], cache=cache)
    hidden = [out.hidden]
    for t in range(1, tokens.shape[1]):
        out = model(tokens[:, t : t + 1], fused=fused[:, t : t + 1], cache=cache, carried_state=hidden[-1][:, -1])
        hidden.append(out.hidden)
    return torch.cat(hidden, 1)


# ---------------------------------------------------------------- every mode agrees, for every span and plan


@torch.no_grad()
@pytest.mark.parametrize("span", SPANS + random_spans(3, seed=53), ids=str)
@pytest.mark.parametrize("shape", [(3, 13), (2, 7)], ids=str)
def test_every_mode_is_the_sequential_definition_at_any_span(span, shape):
    model = span_model(span)
    B, T = shape
    tokens = torch.randint(0, 61, shape, generator=torch.Generator().manual_seed(T))
    p = 2
    fused = fused_positions(p, B, T, 0, tokens.device)
    reference, reference_logits = span_reference(model, tokens, fused)
    outs = {
        "fixed point": model(tokens, passes=T - p + 1, plain_prefix=p),
        "sequential": model.forward_exact(tokens, p, method="sequential"),
        "jacobi": model.forward_exact(tokens, p, method="jacobi"),
        **{f"chunked({c})": model.forward_exact(tokens, p, method="chunked", chunk_size=c) for c in (2, 5)},
    }
    for name, out in outs.items():
        torch.testing.assert_close(out.hidden, reference, atol=TOL, rtol=0, msg=name)
        torch.testing.assert_close(out.logits, reference_logits, atol=TOL, rtol=0, msg=name)
    torch.testing.assert_close(decode_token_by_token(model, tokens, fused), reference, atol=TOL, rtol=0)
    assert outs["jacobi"].passes == T - p + 1


@torch.no_grad()
@pytest.mark.parametrize("span", SPANS[:3], ids=str)
def test_plans_with_plain_positions_inside_a_row(span):
    model = span_model(span)
    B, T = 3, 13
    tokens = torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(1))
    fused = random_plan(B, T, seed=2)
    reference, reference_logits = span_reference(model, tokens, fused)
    passes = exact_passes(fused, has_incoming=False)
    assert passes == int(fused.sum(1).max()) + 1 < T  # the plain positions inside shorten the iteration
    outs = [model(tokens, passes=passes, fused=fused),
            *(model.forward_exact(tokens, fused=fused, method=m) for m in ("sequential", "jacobi")),
            model.forward_exact(tokens, fused=fused, method="chunked", chunk_size=4)]
    for out in outs:
        torch.testing.assert_close(out.hidden, reference, atol=TOL, rtol=0)
        torch.testing.assert_close(out.logits, reference_logits, atol=TOL, rtol=0)
    torch.testing.assert_close(decode_token_by_token(model, tokens, fused), reference, atol=TOL, rtol=0)
    # The plan is the intersection with a plain prefix when both are given.
    both = model(tokens, passes=T, plain_prefix=5, fused=fused).hidden
    torch.testing.assert_close(both, span_reference(model, tokens, fused & (torch.arange(T) >= 5))[0], atol=TOL,
                               rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("span", [SPANS[0], SPANS[1]], ids=str)
def test_j_passes_are_exact_before_the_j_th_fused_position(span):
    model = span_model(span)
    B, T = 3, 13
    tokens = torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(4))
    fused = random_plan(B, T, seed=5)
    reference = model.forward_exact(tokens, fused=fused).hidden
    for j in range(1, exact_passes(fused, False) + 1):
        error = (model(tokens, passes=j, fused=fused).hidden - reference).abs().amax(dim=2)  # (B, T)
        for row in range(B):
            positions = fused[row].nonzero().flatten().tolist()
            exact_upto = positions[j - 1] if j - 1 < len(positions) else T  # the j-th fused position (0-based)
            assert error[row, :exact_upto].max() <= TOL, (j, row, error[row])
            if exact_upto < T:  # that position was fed a not-yet-exact state: with random weights it is off
                assert error[row, exact_upto] > 1e-6, (j, row, error[row])


@torch.no_grad()
def test_a_packed_row_restarts_the_recurrence_at_each_document():
    model = span_model(SPANS[1])
    separator = 60
    tokens = torch.randint(0, 60, (2, 14), generator=torch.Generator().manual_seed(6))
    tokens[0, 4] = tokens[0, 9] = tokens[1, 6] = separator  # documents start at 5, 10 (row 0) and 7 (row 1)
    plan = document_plan(tokens, separator)
    assert plan.logical_not().nonzero().tolist() == [[0, 5], [0, 10], [1, 7]]  # (position 1 is plain anyway)
    reference, _ = span_reference(model, tokens, plan & (torch.arange(14) >= 1))
    exact = model.forward_exact(tokens, fused=plan)
    torch.testing.assert_close(exact.hidden, reference, atol=TOL, rtol=0)
    torch.testing.assert_close(model(tokens, passes=14, fused=plan).hidden, reference, atol=TOL, rtol=0)
    torch.testing.assert_close(decode_token_by_token(model, tokens, plan), reference, atol=TOL, rtol=0)
    # Without the restart the first document's last state is fused into the second's first token.
    carried_over = model.forward_exact(tokens).hidden
    assert (carried_over[0, 5] - exact.hidden[0, 5]).abs().max() > 1e-6
    torch.testing.assert_close(carried_over[0, :5], exact.hidden[0, :5], atol=TOL, rtol=0)


# ---------------------------------------------------------------- the blocks below the target run once


class BlockCalls:
    """Counts, per block, the positions each call of its forward ran (forward hooks)."""

    def __init__(self, model: FullBandwidthLM) -> None:
        self.positions = [0] * len(model.blocks)
        self.calls = [0] * len(model.blocks)
        self.handles = [block.register_forward_hook(self.hook(i)) for i, block in enumerate(model.blocks)]

    def hook(self, index: int):
        def count(module, args, output):
            self.calls[index] += 1
            self.positions[index] += args[0].shape[1]
        return count

    def reset(self) -> None:
        self.positions = [0] * len(self.positions)
        self.calls = [0] * len(self.calls)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("target", [1, 2])
def test_blocks_below_the_target_run_once_per_position(target):
    model = span_model((4, "residual", target))
    B, T = 2, 9
    tokens = torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(7))
    calls = BlockCalls(model)
    lower, upper = slice(0, target), slice(target, None)
    with torch.no_grad():
        model(tokens, passes=4, plain_prefix=2)  # a multi-pass forward: 4 passes over the blocks above
        assert calls.calls[lower] == [1] * target and calls.calls[upper] == [4] * (4 - target)
        for method, chunk in (("sequential", 1), ("jacobi", T), ("chunked", 4)):
            calls.reset()
            model.forward_exact(tokens, 2, method=method, chunk_size=chunk)
            assert calls.positions[lower] == [T] * target, method  # each position once, whatever the passes
            assert min(calls.positions[upper]) > T or method == "sequential"
        for mode in ("standard", "soft", "fused:3", "exact"):  # decoding: the prompt, then one position a token
            calls.reset()
            generate(model, tokens, max_new_tokens=5, mode=mode)
            assert calls.positions[lower] == [T + 4] * target, mode
    # Training: the objective's passes (with gradients, and from the sequential fixed point) run the blocks below
    # the target once per step; the blocks above once per pass.
    for objective, passes in ((MultiPassObjective(jitter=0.02), 3), (MultiPassObjective(grad_passes=2), 50)):
        calls.reset()
        out = objective(model, tokens, tokens, passes, 1)
        out.loss.backward()
        assert calls.calls[lower] == [1] * target and calls.positions[lower] == [T] * target, passes
        if passes == 3:
            assert calls.calls[upper] == [3] * (4 - target)
        else:  # capped at the exact count T: pass 1, the fixed point one position at a time, the last two passes
            assert out.passes == T and calls.calls[upper] == [1 + T + 2] * (4 - target)
    calls.remove()


def test_a_pass_above_the_target_costs_its_share_of_the_blocks():
    from fullband.experiments.core.flops import Shape, forward_flops, step_flops

    full = Shape.of(ModelConfig(n_layers=4))
    half = Shape.of(ModelConfig(n_layers=4, feedback_target=2))
    T = 64
    one_pass = forward_flops(full, T, True)
    # a pass re-runs blocks 3..4 of 4: the blocks' and attention's share halves; head and fusion stay whole
    upper = forward_flops(half, T, True, upper=True)
    head_and_fusion = 2.0 * (full.vocab_size * full.d_model + 2 * full.d_model ** 2) * T
    assert upper == pytest.approx((one_pass - head_and_fusion) / 2 + head_and_fusion)
    assert step_flops(half, 8, T, 3, feedback=True) - step_flops(half, 8, T, 1, feedback=True) == \
        pytest.approx(8 * 3 * 2 * upper)


# ---------------------------------------------------------------- impossible spans


@pytest.mark.parametrize(("changes", "names"), [
    ({"feedback_target": 2, "feedback_source": "layer:2"}, "feedback_target=2 with feedback_source='layer:2'"),
    ({"feedback_target": 3, "feedback_source": "layer:1"}, "feedback_target=3 with feedback_source='layer:1'"),
    ({"feedback_target": 4}, "feedback_target=4 is invalid"),
    ({"feedback_target": -1}, "feedback_target=-1 is invalid"),
    ({"feedback_target": 1, "input_norm": "all"}, "feedback_target=1 with input_norm='all'"),
    ({"feedback_target": 1, "input_norm": "paper"}, "feedback_target=1 with input_norm='paper'"),
])
def test_an_impossible_span_is_refused_in_one_line_naming_the_fields(changes, names):
    with pytest.raises(ConfigError) as error:
        ModelConfig(n_layers=4, **changes)
    assert names in str(error.value) and "\n" not in str(error.value)
    assert error.value.field == "feedback_target"


# ---------------------------------------------------------------- the default span, bit for bit


# The fixture's numbers were computed on one thread on a CPU where torch dispatches AVX512 kernels. Float sums
# split across threads, or vectorised at another width, round differently in the last bit: on one thread and that
# kind the check is bit for bit; on another kind the kernels themselves differ, so it allows float64 rounding only.
FIXTURE_CPU_CAPABILITY = "AVX512"


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    if torch.backends.cpu.get_cpu_capability() == FIXTURE_CPU_CAPABILITY:
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=1e-10, atol=1e-13)


@pytest.mark.usefixtures("one_thread")
def test_the_default_span_gives_the_numbers_of_the_code_before_spans_bit_for_bit():
    """tests/model/fixtures/default_span: a checkpoint written by the code before feedback_target existed (its
    config.json has no such field) and what that code computed from it (float64, one thread): logits in every
    execution mode, greedy tokens in every decoding mode, and a training objective's loss and gradients (2-pass with
    jitter, and truncated from the fixed point)."""
    model = FullBandwidthLM.from_pretrained(FIXTURE, dtype=torch.float64)
    assert model.config.feedback_target == 0 and "feedback_target" not in (FIXTURE / "config.json").read_text()
    expected = load_file(str(FIXTURE / "expected.safetensors"))
    tokens = expected["tokens"]
    with torch.no_grad():
        assert _same(model(tokens).logits, expected["standard_logits"])
        assert _same(model(tokens, passes=3, plain_prefix=2).logits, expected["fused3_logits"])
        exact = model.forward_exact(tokens, plain_prefix=2, method="sequential")
        assert _same(exact.logits, expected["exact_logits"]) and _same(exact.hidden, expected["exact_hidden"])
        for mode in ("standard", "soft", "fused:2", "exact"):
            got = generate(model, tokens[:, :4], max_new_tokens=6, mode=mode)
            assert torch.equal(got, expected[f"generate_{mode.replace(':', '')}"]), mode
    model.train()
    for name, objective, passes, prefix in (("objective", MultiPassObjective(0.5, jitter=0.02), 3, 2),
                                            ("truncated", MultiPassObjective(0.3, grad_passes=2), 11, 1)):
        model.zero_grad()
        torch.manual_seed(0)
        out = objective(model, tokens, tokens, passes, prefix)
        out.loss.backward()
        assert _same(out.loss.detach(), expected[f"{name}_loss"]), name
        assert _same(torch.cat([p.grad.flatten() for p in model.parameters()]), expected[f"{name}_grads"]), name
