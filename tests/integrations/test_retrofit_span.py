"""A retrofit at a span (issue 53): the pretrained decoder's layers run by fullband from the feedback target on give,
for Llama, Qwen2 and GPT-2, the pretrained model's own logits without fusion and the sequential definition of
DESIGN.md §1-§2 in every mode, computed here through transformers' own forward with the target stream swapped in
(a forward pre-hook on the layer after the target), never through fullband's layer code."""

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import fullband
from fullband.config import ConfigError
from fullband.generation import generate
from fullband.integrations.retrofit import RetrofittedLM
from fullband.integrations.retrofit.config import LAST_HIDDEN, RetrofitOptions
from fullband.training.objective import MultiPassObjective

TOL = 1e-9
SMALL = dict(vocab_size=61, initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
LAYERS = 3


def llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        **SMALL))


def qwen2() -> Qwen2ForCausalLM:
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        **SMALL))


def gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64, **SMALL))


ARCHITECTURES = {"llama": llama, "qwen2": qwen2, "gpt2": gpt2}
SPANS = [(LAST_HIDDEN, 1), (2, 1), (LAST_HIDDEN, 2)]  # (feedback_source, feedback_target)


def make(arch: str, source, target, dtype=torch.float64):
    torch.manual_seed(0)
    base = ARCHITECTURES[arch]().to(dtype).eval()
    return base, fullband.retrofit(base, feedback_source=source, feedback_target=target).eval()


def layers_of(base):
    model = base.base_model
    return model.h if hasattr(model, "h") else model.layers


@torch.no_grad()
def definition(model: RetrofittedLM, base, tokens: torch.Tensor, fused: torch.Tensor):
    """Sequential states and logits from transformers' forward alone: for t = 1..T the whole prefix runs through
    ``base.base_model`` with the input of layer k+1 (the target stream) replaced by the plain stream z^k (its own
    ``hidden_states[k]``) at plain positions and fuse(z^k_t, h_{t-1}) at fused ones; h_t is ``hidden_states[s]`` (or the
    last, normed state for last_hidden)."""
    k, source = model.config.feedback_target, model.config.feedback_source
    T = tokens.shape[1]
    emb = model.embed(tokens)
    lower = base.base_model(inputs_embeds=emb, output_hidden_states=True).hidden_states[k]  # (B, T, D) plain z^k
    stream, states, top = [], [], None
    for t in range(T):
        if t > 0 and bool(fused[:, t].any()):
            u = model.fusion(lower[:, t], states[-1])
            stream.append(torch.where(fused[:, t, None], u, lower[:, t]))
        else:
            stream.append(lower[:, t])
        swapped = torch.stack(stream, 1)

        def swap(module, args, swapped=swapped):
            return (swapped, *args[1:])

        handle = layers_of(base)[k].register_forward_pre_hook(swap)
        try:
            out = base.base_model(inputs_embeds=emb[:, : t + 1], output_hidden_states=True)
        finally:
            handle.remove()
        top = out.last_hidden_state
        states.append((top if source == LAST_HIDDEN else out.hidden_states[source])[:, t])
    return torch.stack(states, 1), model.lm_head(top)


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 11), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_without_fusion_the_layers_run_here_give_the_pretrained_logits(arch, tokens):
    base, model = make(arch, LAST_HIDDEN, 2, torch.float32)
    expected = base(tokens).logits
    torch.testing.assert_close(model(tokens).logits, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(model(tokens, passes=3, plain_prefix=tokens.shape[1]).logits, expected, atol=1e-6,
                               rtol=1e-6)
    assert model(tokens, passes=2).logits.sub(expected).abs().max() > 1e-3  # ... and fusing changes them


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("span", SPANS, ids=str)
def test_every_mode_is_the_definition_at_a_span(arch, span, tokens):
    base, model = make(arch, *span)
    B, T = tokens.shape
    fused = torch.ones(B, T, dtype=torch.bool)
    fused[1, 4] = fused[2, 7] = False  # plain positions inside rows (a document restart)
    fused[:, :2] = False  # a plain prefix of 2
    reference, reference_logits = definition(model, base, tokens, fused)
    passes = int(fused.sum(1).max()) + 1
    outs = {"fixed point": model(tokens, passes=passes, fused=fused),
            **{m: model.forward_exact(tokens, fused=fused, method=m) for m in ("sequential", "jacobi")},
            "chunked": model.forward_exact(tokens, fused=fused, method="chunked", chunk_size=4)}
    for name, out in outs.items():
        torch.testing.assert_close(out.hidden, reference, atol=TOL, rtol=0, msg=name)
        torch.testing.assert_close(out.logits, reference_logits, atol=TOL, rtol=0, msg=name)
    # Exact KV-cache decoding token by token through the transformers cache.
    cache = model.new_cache(B, T)
    hidden = [model(tokens[:, :1], cache=cache).hidden]
    for t in range(1, T):
        hidden.append(model(tokens[:, t : t + 1], fused=fused[:, t : t + 1], cache=cache,
                            carried_state=hidden[-1][:, -1]).hidden)
    torch.testing.assert_close(torch.cat(hidden, 1), reference, atol=TOL, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_decoding_modes_and_left_padding_at_a_span(arch):
    base, model = make(arch, LAST_HIDDEN, 1)
    prompts = [[5, 17, 3, 44, 8, 21], [9, 2, 33]]
    for mode in ("standard", "soft", "fused:2", "exact"):
        batched = generate(model, prompts, 5, mode=mode)
        assert batched == [generate(model, p, 5, mode=mode) for p in prompts], mode
    seq = list(prompts[0])  # greedy exact decoding is the argmax of the definition, token by token
    for _ in range(4):
        ids = torch.tensor([seq])
        fused = torch.ones_like(ids, dtype=torch.bool)
        fused[:, 0] = False
        seq.append(int(definition(model, base, ids, fused)[1][0, -1].argmax()))
    assert generate(model, prompts[0], 4, mode="exact") == seq
    assert generate(model, prompts[0], 4, mode="standard") == \
        base.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False)[0].tolist()


class LayerCalls:
    def __init__(self, base) -> None:
        self.positions = [0] * LAYERS
        self.handles = [layer.register_forward_hook(self.count(i)) for i, layer in enumerate(layers_of(base))]

    def count(self, index):
        def hook(module, args, output):
            self.positions[index] += args[0].shape[1]
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_layers_below_the_target_run_once_per_position(arch, tokens):
    base, model = make(arch, LAST_HIDDEN, 2, torch.float32)
    T = tokens.shape[1]
    calls = LayerCalls(base)
    with torch.no_grad():
        model(tokens, passes=4)
        assert calls.positions[:2] == [T, T] and calls.positions[2] == 4 * T
        calls.positions = [0] * LAYERS
        generate(model, tokens, max_new_tokens=5, mode="fused:3")
        assert calls.positions[:2] == [T + 4, T + 4] and calls.positions[2] == 4 * T + 4
    calls.positions = [0] * LAYERS
    model.train()
    MultiPassObjective(jitter=0.02)(model, tokens, tokens, 3).loss.backward()  # training: once per step
    assert calls.positions[:2] == [T, T] and calls.positions[2] == 3 * T
    assert model.fusion.state_proj.weight.grad.abs().sum() > 0 and model.embed.weight.grad.abs().sum() > 0
    calls.remove()


def test_a_span_is_saved_and_loaded(tmp_path, tokens):
    _, model = make("qwen2", 2, 1)
    model.save_pretrained(tmp_path / "r")
    loaded = RetrofittedLM.from_pretrained(tmp_path / "r", dtype=torch.float64)
    assert loaded.config == model.config and loaded.config.feedback_target == 1
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward_exact(tokens, 2).logits, model.forward_exact(tokens, 2).logits,
                                   atol=0, rtol=0)
    assert "fused into the residual stream after block 1" in (tmp_path / "r" / "README.md").read_text()


def test_impossible_or_unsupported_spans_are_refused_in_one_line():
    base = llama()
    for source, target in ((2, 2), (1, 1), (LAST_HIDDEN, LAYERS), (LAST_HIDDEN, -1)):
        with pytest.raises(ValueError, match="feedback_target") as error:
            fullband.retrofit(base, feedback_source=source, feedback_target=target)
        assert "\n" not in str(error.value)
    mistral = MistralForCausalLM(MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, **SMALL))
    with pytest.raises(ValueError, match=r"feedback_target=1 is invalid: MistralForCausalLM .* not one of the"):
        fullband.retrofit(mistral, feedback_target=1)
    fullband.retrofit(mistral)  # at the embeddings every causal LM retrofits as before
    with pytest.raises(ConfigError, match="feedback_target='one' is invalid"):
        RetrofitOptions(feedback_target="one")
    with pytest.raises(ConfigError, match=r"retrofit\.feedback_target=1 is invalid: applies only to init_from"):
        RetrofitOptions(feedback_target=1).check("some/dir", True)
