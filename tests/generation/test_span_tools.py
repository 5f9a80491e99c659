"""Every tool at a recurrence span (issue 53): batched decoding with left padding, speculative and static decoding,
the transformers classes and lm-eval's scoring give, for a model whose state goes from block 3 into the stream after
block 1 (and one whose target is block 2 of 4), what the span's own definition gives (the server:
tests/serve/test_serve_span.py)."""

import pytest
import torch
from conftest import make_model
from transformers import AutoModelForCausalLM

from fullband.evaluation.continuation import score_continuations
from fullband.generation import SpeculativeConfig, generate
from fullband.integrations.hf import FullBandwidthForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

MODES = ("standard", "soft", "fused:2", "exact")
PROMPTS = [[5, 17, 3, 44, 8, 21], [9, 2, 33], [1, 2, 3, 4]]
NEW = 6


@pytest.fixture(params=[("layer:3", 1), ("residual", 2)], ids=["layer3_to_1", "top_to_2"], scope="module")
def span_model(request):
    source, target = request.param
    return make_model(n_layers=4, feedback_source=source, feedback_target=target, max_seq_len=64)


def exact_greedy(model, prompt, new):
    """Greedy exact decoding from the definition: the argmax of the exact forward of the whole sequence."""
    seq = list(prompt)
    for _ in range(new):
        seq.append(int(model.forward_exact(torch.tensor([seq]), method="sequential").logits[0, -1].argmax()))
    return seq


@torch.no_grad()
def test_batched_left_padded_decoding_equals_one_by_one_in_every_mode(span_model):
    for mode in MODES:
        assert generate(span_model, PROMPTS, NEW, mode) == [generate(span_model, p, NEW, mode) for p in PROMPTS], mode
    assert generate(span_model, PROMPTS[0], NEW, "exact") == exact_greedy(span_model, PROMPTS[0], NEW)


@torch.no_grad()
@pytest.mark.parametrize("drafter", ["standard", "early_exit:1"])
def test_speculative_greedy_equals_plain_greedy(span_model, drafter):
    for mode in ("soft", "exact"):
        for gamma in (1, 3):
            config = SpeculativeConfig(drafter=drafter, gamma=gamma)
            assert generate(span_model, PROMPTS, NEW, mode, speculative=config) == \
                generate(span_model, PROMPTS, NEW, mode), (mode, gamma)


@torch.no_grad()
def test_static_step_equals_the_eager_step(span_model):
    for mode in MODES:
        assert generate(span_model, PROMPTS, NEW, mode, step="static") == generate(span_model, PROMPTS, NEW, mode)


@torch.no_grad()
def test_the_transformers_classes_keep_the_span(span_model, tmp_path):
    hf = FullBandwidthForCausalLM.from_native(span_model).eval()
    ids = torch.tensor([PROMPTS[0]])
    out = hf.generate(ids, max_new_tokens=NEW, do_sample=False, decoding_mode="exact")
    assert out[0].tolist() == generate(span_model, PROMPTS[0], NEW, "exact")
    hf.save_pretrained(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64).eval()
    assert loaded.config.feedback_target == span_model.config.feedback_target
    torch.testing.assert_close(loaded(ids, passes=3).logits, span_model(ids, passes=3).logits, atol=0, rtol=0)
    assert "fused after block" in (tmp_path / "hf" / "README.md").read_text()


@torch.no_grad()
def test_lm_eval_scoring_is_the_exact_recurrence(span_model):
    context, continuation = PROMPTS[0], [7, 30, 12]
    [(total, _)] = score_continuations(span_model, [(context, continuation)], "exact")
    logits = span_model.forward_exact(torch.tensor([context + continuation[:-1]])).logits[0]
    logprobs = torch.log_softmax(logits, -1)[len(context) - 1 :]
    assert total == pytest.approx(float(logprobs.gather(1, torch.tensor(continuation)[:, None]).sum()), abs=1e-9)
