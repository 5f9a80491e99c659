"""The GPU rows of issue 45's Done-when, measured in one run (benchmarks/gpu_check.py): training at GPT-2-small size in
bf16 (MFU with NorMuon, NorMuon/AdamW, Trainer/bare step) and greedy decoding with the static, compiled step against
transformers' ``generate`` on identical weights (identical tokens, batch 1 and 8; soft/standard).

Every row is a :class:`Row` (name, value, unit, target, ok, note) for results.json and the markdown table of
docs/LOG.md. A :class:`Budget` guards the run: a section whose estimate does not fit in the time left is skipped (its
rows say so) and an alarm stops a section that overruns, so one run ends cleanly inside a device lease. On a CPU the
same code runs at smoke size (:data:`SIZES`), in seconds: what tests/test_gpu_check.py checks.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import signal
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from fullband.bench import steps
from fullband.bench.timing import interleaved, ratio, synchronize
from fullband.config import ModelConfig
from fullband.model import FullBandwidthLM
from fullband.training.config import OptimConfig, ScheduleConfig, TrainConfig
from fullband.training.metrics import flops_per_token, peak_flops
from fullband.training.optim import build_optimizer


@dataclass(frozen=True)
class Size:
    """The dimensions of one run: the training model and batch, and the decoding prompts."""

    d_model: int
    n_layers: int
    n_heads: int
    vocab_size: int
    seq_len: int
    batch_size: int
    rounds: int  # interleaved rounds of every timing
    reps: int  # calls per case and round (training)
    prompt_len: int
    new_tokens: int
    decode_batches: tuple[int, ...]
    estimates_s: dict[str, float] = field(default_factory=dict)  # what each section takes, compiling included


SIZES = {
    # GPT-2-small (12 x 768, seq 1024, GPT-2's vocabulary padded to 64), nanoGPT's batch of 16 rows on one GPU.
    "cuda": Size(768, 12, 12, 50304, 1024, 16, rounds=4, reps=3, prompt_len=32, new_tokens=128, decode_batches=(1, 8),
                 estimates_s={"train": 120.0, "decode": 150.0}),
    "cpu": Size(64, 2, 2, 256, 64, 4, rounds=2, reps=1, prompt_len=8, new_tokens=8, decode_batches=(1, 4),
                estimates_s={"train": 20.0, "decode": 20.0}),
}


@dataclass
class Row:
    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None  # None: no target, or not measured
    note: str = ""


class BudgetExceeded(Exception):
    """The run's time is up (:class:`Budget`)."""


class Budget:
    """Seconds left of ``total``: :meth:`fits` says whether a section of some estimate starts, :meth:`guard` stops
    one that overruns (SIGALRM, main thread) so the rows so far are still written."""

    def __init__(self, total: float) -> None:
        self.total, self.start = total, time.perf_counter()

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.start)

    def fits(self, estimate: float) -> bool:
        return self.left() >= estimate

    @contextmanager
    def guard(self) -> Iterator[None]:
        def stop(signum: int, frame: Any) -> None:
            raise BudgetExceeded(f"the budget of {self.total:.0f} s is spent")

        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def matmul_flops_per_token(model: FullBandwidthLM, seq_len: int) -> float:
    """Training FLOPs per token of a single-pass step (:func:`flops_per_token`) over the parameters that enter its
    matrix products: not the embedding lookup, but the head, which a tied embedding shares (counted once there), and
    not the fusion, which a single pass does not run."""
    c = model.config
    params = model.num_parameters(include_embedding=False) + (c.vocab_size * c.d_model if c.tie_embeddings else 0)
    params -= sum(p.numel() for p in model.fusion.parameters()) if model.fusion is not None else 0
    return flops_per_token(params, c.n_layers, c.d_model, seq_len)


def training_rows(device: torch.device, size: Size) -> Iterator[list[Row]]:
    """bf16 autocast (CUDA) single-pass training steps at ``size``: the Trainer's step with the recipe's NorMuon (its
    MFU), and bare steps with NorMuon, NorMuon with the compiled iteration, and AdamW, interleaved."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=size.vocab_size, d_model=size.d_model, n_layers=size.n_layers,
                         n_heads=size.n_heads, max_seq_len=size.seq_len, feedback=True)
    model = FullBandwidthLM(config).to(device).train()
    tokens = torch.randint(0, size.vocab_size, (size.batch_size, size.seq_len))  # host: the Trainer pins, copies
    on_device = tokens.to(device)
    cuda = device.type == "cuda"
    train_cfg = TrainConfig(batch_size=size.batch_size, seq_len=size.seq_len, max_steps=10**6, checkpoint_every=0,
                            compile="true" if cuda else "false", autocast="auto", log_every=10**6)
    normuon = OptimConfig(optimizer="normuon")  # the recipe's optimizer, fullband train's default
    adamw = dataclasses.replace(normuon, optimizer="adamw")
    schedule = ScheduleConfig(feedback_start=1.0)  # single-pass steps: the transformer's own cost
    from fullband.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="fullband-gpu-check-") as tmp:
        trainer = Trainer(copy.deepcopy(model), train_cfg, normuon, schedule,
                          lambda step, rank, world: (tokens, tokens), out_dir=tmp, progress=False)
        dtype = trainer.autocast_dtype
        counter = iter(range(10**9))
        cases: dict[str, Callable[[], Any]] = {"trainer": lambda: trainer.train_step(next(counter))}
        for name, optim_cfg in (("normuon", normuon), ("normuon-compiled-ns", dataclasses.replace(normuon,
                                ns_compile=True)), ("adamw", adamw)):
            bare = copy.deepcopy(model)
            if trainer.compiled:
                bare.compile_blocks()  # what the Trainer runs
            cases[name] = bare_step(bare, on_device, build_optimizer(bare, optim_cfg), dtype)
        cases, failed = working(cases)  # the first call compiles; a case that fails is dropped, its rows say why
        times = interleaved(cases, size.rounds, device, reps=size.reps, warmup=1)
        syncs = host_syncs(cases["trainer"], 3) / 3 if cuda and "trainer" in cases else None
    n_tokens = tokens.numel()
    peak = peak_flops(device, dtype or torch.float32)
    precision = "bf16 autocast" if dtype == torch.bfloat16 else "float32"
    shape = f"{size.n_layers} x {size.d_model}, seq {size.seq_len}, batch {size.batch_size}"
    mfu_row = Row(f"train MFU, Trainer step, NorMuon, {precision} ({shape})", None, "%", ">= 35",
                  note=failed.get("trainer", "" if peak else "no rated peak for this device"))
    if "trainer" in times:
        seconds = statistics.median(times["trainer"])
        mfu = matmul_flops_per_token(model, size.seq_len) * n_tokens / seconds / peak if peak else None
        mfu_row.value, mfu_row.ok = (100 * mfu, mfu >= 0.35) if mfu is not None else (None, None)
        mfu_row.note = f"{n_tokens / seconds / 1e3:.1f}k tok/s, {1000 * seconds:.1f} ms/step; " + mfu_row.note
    yield [mfu_row,
           ratio_row("NorMuon / AdamW step time (bare steps)", times, failed, "normuon", "adamw", "<= 1.2"),
           ratio_row("NorMuon (compiled Newton-Schulz) / AdamW step time", times, failed, "normuon-compiled-ns",
                     "adamw", "<= 1.2", "optim.ns_compile true"),
           ratio_row("Trainer.train_step / bare step time (NorMuon)", times, failed, "trainer", "normuon", "<= 1.05")]
    if syncs is not None:
        yield [Row("host syncs per Trainer step (CUDA sync debug mode)", syncs, "", "0", syncs == 0,
                   "between read-backs (log_every)")]


def raise_(error: Exception) -> None:
    raise error


def host_syncs(fn: Callable[[], Any], calls: int) -> int:
    """The operations that make the host wait for the GPU in ``calls`` calls of ``fn`` (torch.cuda's sync debug
    mode, which warns at each: ``.item()``, a device-to-host copy, a stream synchronisation)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(calls):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def working(cases: dict[str, Callable[[], Any]],
            outputs: dict[str, Any] | None = None) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Call each case once (the warm-up: compiling, allocating; what it returns goes into ``outputs``); (the cases
    that ran, {case: why} of those that raised), so one failing path (a compiler error on this device) costs its
    rows, not the section's."""
    ok, failed = {}, {}
    for name, case in cases.items():
        try:
            result = case()
            ok[name] = case
            if outputs is not None:
                outputs[name] = result
        except (BudgetExceeded, KeyboardInterrupt):
            raise
        except Exception as error:  # any failure of one case is reported in its rows
            failed[name] = f"{name} failed: {type(error).__name__}: {str(error).strip()[:200]}"
    return ok, failed


def ratio_row(name: str, times: dict[str, list[float]], failed: dict[str, str], numerator: str, denominator: str,
              target: str = "", note: str = "") -> Row:
    """Row ``name``: the median ratio of ``numerator``'s time to ``denominator``'s, checked against ``target``
    (``<= x`` or ``>= x``, or none), or why it could not be measured."""
    missing = [failed.get(case, f"{case} not run") for case in (numerator, denominator) if case not in times]
    if missing:
        return Row(name, None, "x", target, None, "; ".join(missing))
    value = ratio(times, numerator, denominator)
    ok = None
    if target:
        bound = float(target.split()[1])
        ok = value <= bound if target.startswith("<=") else value >= bound
    return Row(name, value, "x", target, ok, note)


def bare_step(model: FullBandwidthLM, tokens: torch.Tensor, optimizer: Any,
              dtype: torch.dtype | None) -> Callable[[], None]:
    """One training step of ``model`` on ``tokens`` without the Trainer: autocast as it runs, clipping at 1."""
    params = list(model.parameters())

    def loss() -> torch.Tensor:
        with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype is not None):
            return steps.fullband_loss(model, tokens)()

    return lambda: steps.optimizer_step(loss, optimizer, params)


def decode_rows(device: torch.device, size: Size) -> Iterator[list[Row]]:
    """Greedy decoding at ``size``'s model (float32) with the static, compiled step against LlamaForCausalLM's
    ``generate`` on the same weights (identical tokens), soft against standard, and compiled against eager: one
    batch size's rows at a time (a run stopped by its budget keeps those measured)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=size.vocab_size, d_model=size.d_model, n_layers=size.n_layers,
                         n_heads=size.n_heads, max_seq_len=size.seq_len, feedback=True)
    model = FullBandwidthLM(config).to(device).eval()
    try:
        llama = steps.llama_twin(model).eval()
    except ImportError as error:  # no transformers here: the rows against generate say so, the others are measured
        llama, missing = None, error
    n = size.new_tokens
    for batch in size.decode_batches:
        prompts = torch.randint(0, size.vocab_size, (batch, size.prompt_len), device=device)
        cases = {"compiled standard": lambda p=prompts: steps.greedy_fullband(model, p, n, "standard", "compiled"),
                 "compiled soft": lambda p=prompts: steps.greedy_fullband(model, p, n, "soft", "compiled"),
                 "eager standard": lambda p=prompts: steps.greedy_fullband(model, p, n, "standard"),
                 "generate": (lambda p=prompts: steps.greedy_transformers(llama, p, n)) if llama is not None
                 else lambda: raise_(missing)}
        tokens: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            cases, failed = working(cases, tokens)  # the warm-up: compiles, captures the graphs
            tokens["eager soft"] = steps.greedy_fullband(model, prompts, n, "soft")  # checked, not timed
            times = interleaved(cases, size.rounds, device, warmup=0)
        same_hf = "generate" in tokens and torch.equal(tokens["compiled standard"], tokens["generate"]) \
            if "compiled standard" in tokens else False
        same_eager = all(torch.equal(tokens[f"compiled {m}"], tokens[f"eager {m}"]) for m in ("standard", "soft")
                         if f"compiled {m}" in tokens)
        per_s = {name: f"{batch * n / statistics.median(t):.0f} tok/s" for name, t in times.items()}
        speed = ratio_row(f"greedy decode speed, static+compiled / HF generate, batch {batch}", times, failed,
                          "generate", "compiled standard", f">= {1.5 if batch == 1 else 1.2}",
                          f"{'identical tokens' if same_hf else 'TOKENS DIFFER'}; {per_s.get('compiled standard')} "
                          f"vs {per_s.get('generate')}")
        speed.ok = speed.ok and same_hf if speed.ok is not None else None
        if device.type == "cuda" and "compiled standard" in cases:
            # A decode's own few (the prompt's checks, the tokens' copy to the host at the end), none per token.
            syncs = host_syncs(cases["compiled standard"], 1)
            yield [Row(f"host syncs per generated token (static+compiled), batch {batch}", syncs / n, "", "< 0.1",
                       syncs / n < 0.1, f"{syncs} in a decode of {n} tokens (CUDA sync debug mode)")]
        yield [speed,
               ratio_row(f"soft / standard decode speed (compiled), batch {batch}", times, failed,
                         "compiled standard", "compiled soft", ">= 0.95"),
               ratio_row(f"compiled / eager decode step speed (standard), batch {batch}", times, failed,
                         "eager standard", "compiled standard",
                         note="tokens == eager in standard and soft" if same_eager else "TOKENS DIFFER FROM EAGER")]


SECTIONS: dict[str, Callable[[torch.device, Size], Iterator[list[Row]]]] = {"train": training_rows,
                                                                             "decode": decode_rows}


def run_check(device: torch.device, budget_s: float, sections: tuple[str, ...] = tuple(SECTIONS),
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every section of ``sections`` that fits in the budget; the rows, the device, torch and the seconds."""
    size = SIZES[device.type]
    budget = Budget(budget_s)
    rows: list[Row] = []
    for name in sections:
        estimate = size.estimates_s[name]  # a section that overruns it is stopped by the guard at the budget
        if not budget.fits(estimate):
            rows.append(Row(f"{name} section", None, "", note=f"skipped: {budget.left():.0f} s left, it takes "
                            f"~{estimate:.0f} s"))
            continue
        progress(f"gpu_check: {name} ({budget.left():.0f} s left of {budget_s:.0f})")
        start = time.perf_counter()
        try:
            with budget.guard():
                for measured in SECTIONS[name](device, size):
                    rows += measured
        except BudgetExceeded as stopped:
            rows.append(Row(f"{name} section", None, "", note=f"stopped: {stopped}"))
        except Exception as error:  # out of memory, a compiler error: the other sections go on
            traceback.print_exc()
            rows.append(Row(f"{name} section", None, "", note=f"failed: {type(error).__name__}: "
                            f"{(str(error).strip().splitlines() or [''])[0][:200]}"))
        synchronize(device)
        progress(f"gpu_check: {name} took {time.perf_counter() - start:.0f} s")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "budget_s": budget_s,
            "seconds": budget_s - budget.left(), "size": dataclasses.asdict(size),
            "rows": [dataclasses.asdict(r) for r in rows]}


def markdown(results: dict[str, Any]) -> str:
    """The rows as a markdown table for docs/LOG.md, headed by the device and torch."""
    lines = [f"gpu_check on {results['device']}, torch {results['torch']} (CUDA {results['cuda']}), "
             f"{results['seconds']:.0f} s", "", "| row | value | target | ok | note |", "|---|---|---|---|---|"]
    for r in results["rows"]:
        value = "" if r["value"] is None or not math.isfinite(r["value"]) else f"{r['value']:.3g} {r['unit']}"
        ok = {True: "yes", False: "**no**", None: ""}[r["ok"]]
        lines.append(f"| {r['name']} | {value.strip()} | {r['target']} | {ok} | {r['note']} |")
    return "\n".join(lines)
