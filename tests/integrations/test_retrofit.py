"""Retrofitted Llama / Qwen2 / GPT-2: the pretrained model's own logits with the fusion unused, the recurrence
computed every way agrees (float64), decoding equals its definition, checkpoints round-trip, training works."""

import json
import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import fullband
from fullband.generation import generate
from fullband.integrations.retrofit import RetrofittedLM, retrofit
from fullband.integrations.retrofit.io import load_retrofit_config, load_weights_into
from fullband.model import FeedbackLM, FullBandwidthLM, exact_pass_count
from fullband.model.serialization import CheckpointError
from fullband.training.objective import MultiPassObjective

TOL = 1e-9
PROMPT = [5, 17, 3, 44, 8, 21]
NEW = 6
SMALL = dict(vocab_size=61, initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        **SMALL))


def qwen2() -> Qwen2ForCausalLM:
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        **SMALL))


def gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **SMALL))


ARCHITECTURES = {"llama": llama, "qwen2": qwen2, "gpt2": gpt2}


def make(arch: str, dtype: torch.dtype = torch.float64, **kwargs) -> tuple[torch.nn.Module, RetrofittedLM]:
    """A tiny random pretrained model and its retrofit; fusion weights non-trivial (std 0.2)."""
    torch.manual_seed(0)
    base = ARCHITECTURES[arch]().to(dtype).eval()
    return base, fullband.retrofit(base, **kwargs).eval()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fusion_unused_gives_the_pretrained_logits(arch, tokens):
    base, model = make(arch, torch.float32)
    expected = base(tokens).logits
    assert torch.equal(model(tokens).logits, expected)
    # A plain prefix covering every position never fuses, whatever the pass count.
    assert torch.equal(model(tokens, passes=3, plain_prefix=tokens.shape[1]).logits, expected)
    assert model(tokens, passes=2).logits.sub(expected).abs().max() > 1e-3  # ... and fusing changes them


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("plain_prefix", [1, 4])
def test_multipass_chunked_and_cached_equal_sequential(arch, tokens, plain_prefix):
    _, model = make(arch)
    T = tokens.shape[1]
    sequential = model.forward_exact(tokens, plain_prefix)  # one position at a time through the HF cache
    assert sequential.passes == T
    multipass = model(tokens, passes=T - plain_prefix + 1, plain_prefix=plain_prefix)
    jacobi = model.forward_exact(tokens, plain_prefix, method="jacobi")
    assert jacobi.passes == exact_pass_count(plain_prefix, T, 0, False)
    chunked = [model.forward_exact(tokens, plain_prefix, method="chunked", chunk_size=c) for c in (3, 5)]
    for out in [multipass, jacobi, *chunked]:
        torch.testing.assert_close(out.hidden, sequential.hidden, atol=TOL, rtol=0)
        torch.testing.assert_close(out.logits, sequential.logits, atol=TOL, rtol=0)


@torch.no_grad()
def test_k_passes_exact_exactly_up_to_p_plus_k_minus_1(tokens):
    _, model = make("llama")
    plain_prefix = 2
    reference = model.forward_exact(tokens, plain_prefix).hidden
    for k in (1, 3, 6):
        error = (model(tokens, passes=k, plain_prefix=plain_prefix).hidden - reference).abs().amax(dim=(0, 2))
        exact_upto = plain_prefix + k - 1
        assert error[:exact_upto].max() <= TOL and error[exact_upto] > 1e-3, (k, error)


@torch.no_grad()
def test_intermediate_layer_feedback(tokens):
    _, top = make("qwen2")
    _, model = make("qwen2", feedback_source=1)  # the residual stream after block 1
    sequential = model.forward_exact(tokens, 2)
    torch.testing.assert_close(model(tokens, passes=12, plain_prefix=2).hidden, sequential.hidden, atol=TOL, rtol=0)
    assert sequential.logits.sub(top.forward_exact(tokens, 2).logits).abs().max() > 1e-3
    for bad in (0, 2, "residual", True):  # 2 = L: transformers only exposes the top state after the final norm
        with pytest.raises(ValueError, match="feedback_source"):
            retrofit(gpt2(), feedback_source=bad)


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_soft_decoding_is_argmax_of_the_exact_forward(arch):
    base, model = make(arch)
    seq = list(PROMPT)
    for _ in range(NEW):
        logits = model.forward_exact(torch.tensor([seq]), plain_prefix=len(PROMPT)).logits
        seq.append(int(logits[0, -1].argmax()))
    assert generate(model, PROMPT, NEW, mode="soft") == seq
    standard = base.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False)[0].tolist()
    assert generate(model, PROMPT, NEW, mode="standard") == standard
    assert seq != standard  # the carried state changes what is generated


def recurrent_logits(model: RetrofittedLM, seq: torch.Tensor, prompt_inputs: list[torch.Tensor]) -> torch.Tensor:
    """Logits of ``seq`` (1, T) with no cache and no pass loop: the given inputs for the first positions, then
    u_t = fusion(e_t, h_{t-1}) one position at a time, the whole prefix re-run through the network each time."""
    emb = model.embed(seq)
    inputs = list(prompt_inputs)
    while True:
        t = len(inputs)
        states, head_input = model.run_stack(torch.stack(inputs, 1), torch.arange(t)[None])
        if t == seq.shape[1]:
            return model.lm_head(head_input)
        inputs.append(model.fusion(emb[:, t], states[:, t - 1]))


def greedy(logits_of, prompt: list[int]) -> list[int]:
    seq = list(prompt)
    for _ in range(NEW):
        seq.append(int(logits_of(torch.tensor([seq]))[0, -1].argmax()))
    return seq


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_exact_and_fused_decoding_equal_their_definitions(arch):
    _, model = make(arch)
    ids = torch.tensor([PROMPT])
    emb = model.embed(ids)
    # exact: every position after the first is fused, fully recurrent.
    exact = greedy(lambda seq: recurrent_logits(model, seq, [emb[:, 0]]), PROMPT)
    assert generate(model, PROMPT, NEW, mode="exact") == exact
    assert generate(model, PROMPT, NEW, mode="exact", exact_chunk_size=4) == exact
    # fused(k): the prompt's inputs are those of pass k + 1 of the Jacobi iteration (p = 1), the generated
    # positions then follow the exact recurrence on top of them.
    k = 2
    prev = model(ids, passes=k, plain_prefix=1).hidden  # the states pass k + 1 fuses
    prompt_inputs = [emb[:, 0]] + [model.fusion(emb[:, t], prev[:, t - 1]) for t in range(1, len(PROMPT))]
    fused = greedy(lambda seq: recurrent_logits(model, seq, prompt_inputs), PROMPT)
    assert generate(model, PROMPT, NEW, mode=f"fused:{k}") == fused
    assert fused != exact  # k + 1 passes do not make this 6-token prompt exact


@torch.no_grad()
@pytest.mark.parametrize(("arch", "mode"), [("llama", "soft"), ("gpt2", "fused:2"), ("qwen2", "exact")])
def test_batched_left_padding_equals_one_by_one(arch, mode):
    _, model = make(arch)
    prompts = [PROMPT, [9, 1], [33, 2, 60, 7, 12, 13, 40]]
    single = [generate(model, p, NEW, mode=mode, exact_chunk_size=3) for p in prompts]
    assert generate(model, prompts, NEW, mode=mode, exact_chunk_size=3) == single


@torch.no_grad()
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_save_load_round_trip(arch, tokens, tmp_path):
    base, model = make(arch, torch.float32, feedback_source=1 if arch == "gpt2" else "last_hidden")
    model.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "retrofit.json").read_text())
    assert meta["base_architecture"] == type(base).__name__
    assert meta["feedback_source"] == model.config.feedback_source
    loaded = RetrofittedLM.from_pretrained(tmp_path)
    assert loaded.config == model.config
    for passes in (1, 3):
        assert torch.equal(loaded(tokens, passes=passes).logits, model(tokens, passes=passes).logits)
    assert generate(loaded, PROMPT, NEW, mode="soft") == generate(model, PROMPT, NEW, mode="soft")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # the base stays a plain HF checkpoint
    assert torch.equal(plain(tokens).logits, base(tokens).logits)


@torch.no_grad()
def test_resume_hooks_load_weights_in_place(tokens, tmp_path):
    _, model = make("qwen2", torch.float32)
    model.save_pretrained(tmp_path)
    _, other = make("qwen2", torch.float32)
    torch.nn.init.normal_(other.fusion.state_proj.weight)
    torch.nn.init.normal_(other.embed.weight)
    parameters = list(other.parameters())
    assert load_retrofit_config(tmp_path) == other.config
    load_weights_into(other, tmp_path)
    # The same tensor objects, so an optimizer's references to them stay valid.
    assert all(a is b for a, b in zip(other.parameters(), parameters, strict=True))
    assert torch.equal(other(tokens, passes=2).logits, model(tokens, passes=2).logits)
    _, wrong = make("qwen2", torch.float32, feedback_source=1)
    with pytest.raises(CheckpointError, match="config"):
        load_weights_into(wrong, tmp_path)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_multipass_objective_trains_base_and_fusion(arch, tokens):
    _, model = make(arch, torch.float32)
    labels = tokens.clone()
    labels[:, :4] = -100  # SFT: the prompt is masked out of the loss
    out = MultiPassObjective(jitter=0.02)(model, tokens, labels, 3, torch.tensor([1, 3, 5]))
    assert len(out.pass_losses) == 3
    torch.testing.assert_close(out.loss, out.pass_losses[0] + torch.stack(out.pass_losses[1:]).mean())
    out.loss.backward()
    assert model.fusion.state_proj.weight.grad.abs().sum() > 0
    assert model.embed.weight.grad.abs().sum() > 0
    assert model.config.feedback and model.num_parameters() > model.num_parameters(include_embedding=False)
    assert len(model.blocks) == 2


@pytest.mark.parametrize("optimizer", ["muon", "normuon"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_muon_under_the_default_settings_trains_the_blocks_matrices(arch, optimizer, tokens):
    # The default optim.muon_params ("blocks", "fusion") are parameter roles: the retrofitted network's decoder
    # layers (named base.model.layers.* or base.transformer.h.*) are its blocks, whatever their names.
    from fullband.training import build_optimizer
    from fullband.training.config import OptimConfig

    _, model = make(arch, torch.float32)
    model.train()
    optimizer = build_optimizer(model, OptimConfig(optimizer=optimizer))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: [names[id(p)] for p in g["params"]] for g in optimizer.param_groups}
    block_matrices = [n for n, p in model.blocks.named_parameters() if p.dim() == 2]
    assert len(groups["muon"]) == len(block_matrices) > 0
    assert all(p.dim() == 2 and id(p) in {id(q) for q in model.blocks.parameters()}
               for g in optimizer.param_groups if g["name"] == "muon" for p in g["params"])
    assert sorted(groups["muon_fusion"]) == ["fusion.gate_proj.weight", "fusion.state_proj.weight"]
    assert "base.model.embed_tokens.weight" in groups["decay"] or "base.transformer.wte.weight" in groups["decay"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):
        optimizer.zero_grad()
        MultiPassObjective()(model, tokens, tokens, 2).loss.backward()
        optimizer.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert set(groups["muon"]) <= moved and set(groups["muon_fusion"]) <= moved


@pytest.mark.parametrize("cls", [FullBandwidthLM, RetrofittedLM])
def test_both_networks_run_the_one_feedback_forward(cls):
    # Each network supplies its embedding, blocks, head and cache; the forward, the exact evaluation, the pass loop
    # are FeedbackLM's own, neither rewritten nor borrowed by assignment; decoding is fullband.generation's, one for
    # both, and bound onto neither.
    assert issubclass(cls, FeedbackLM)
    assert not any(hasattr(cls, name) for name in ("generate", "stream"))
    shared = ("forward", "forward_exact", "prefill", "iterate_passes", "stack_inputs", "new_cache", "_check_tokens",
              "_positions_and_mask")
    assert not [name for name in shared if name in vars(cls)]
    assert all(getattr(cls, name) is getattr(FeedbackLM, name) for name in shared)
    supplied = ("fuse", "run_stack", "depth_states", "logits_of_top", "_empty_cache", "_stack_mask")
    assert all(name in vars(cls) for name in supplied)
