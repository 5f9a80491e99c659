"""``fullband bench``: the sections (limits, train, passes, decode, exact), one row per figure, the table."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.bench import steps
from fullband.bench.config import BenchConfig
from fullband.bench.timing import copy_case, interleaved, machine_limits, machine_state, matmul_case, ratio
from fullband.bench.workers import combined_share, time_in_workers
from fullband.devices import CPU_FEATURES, resolve_device
from fullband.files import write_json
from fullband.model.linear import (
    PACK_MIN_ROWS,
    fused_inference,
    fused_inference_enabled,
    packed_weights,
    packed_weights_enabled,
)
from fullband.model.recurrence import auto_exact_method
from fullband.training.config import COMPILE_MIN_CPU_STEPS
from fullband.training.metrics import flops_per_token
from fullband.training.step_setup import should_compile


@dataclass
class Row:
    section: str
    case: str
    ms: float | None = None  # median seconds per call x 1000
    figure: str = ""  # throughput or the limit itself
    ratio: float | None = None  # what the case name says it is
    target: str = ""  # the acceptance bound, if any
    of_limit: str = ""  # the figure as a share of the machine's limit
    check: str = ""  # correctness check of the case (identical tokens, same loss, max difference)
    ok: bool | None = None  # the check passed (None: no check)


class Bench:
    """One run: the sections of ``cfg`` on one device, rows appended as they finish."""

    def __init__(self, cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.rows: list[Row] = []
        self.times: dict[str, dict[str, list[float]]] = {}
        self.limits: dict[str, float] = {}
        self.say = progress or (lambda message: None)

    def run(self) -> dict[str, Any]:
        start, before = time.perf_counter(), machine_state()
        self.limits = machine_limits(self.device, self.cfg.rounds, self.cfg.limit_mib)  # the other rows need them
        if "limits" in self.cfg.sections:
            self.rows += [Row("limits", f"memory bandwidth (copy of {self.cfg.limit_mib} MiB)",
                              figure=f"{self.limits['memory_gb_s']:.1f} GB/s"),
                          Row("limits", f"matmul float32 {self.limits['matmul_size']}^3",
                              figure=f"{self.limits['matmul_gflop_s']:.1f} GFLOP/s")]
        for section in ("train", "optim", "passes", "decode", "exact"):
            if section in self.cfg.sections:
                self.say(f"bench: {section} ...")
                torch.manual_seed(self.cfg.seed)
                getattr(self, section)()
        return {"config": dataclasses.asdict(self.cfg), "device": str(self.device), "machine_at_start": before,
                "load_average_at_end": machine_state().get("load_average"), "limits": self.limits,
                "seconds": time.perf_counter() - start, "rows": [dataclasses.asdict(r) for r in self.rows],
                "times_s": self.times}

    # ------------------------------------------------------------------ sections

    def _train_model(self) -> tuple[FullBandwidthLM, torch.Tensor]:
        return steps.train_model(self.cfg.train, self.device)

    def train(self) -> None:
        c = self.cfg.train
        model, tokens = self._train_model()
        llama = steps.llama_twin(model).train()
        gpt2 = steps.gpt2_peer(model.config).to(self.device).train()
        with torch.no_grad():
            ours_loss = float(steps.fullband_loss(model, tokens)())
            llama_loss = float(steps.transformers_loss(llama, tokens)())
        same_loss = abs(ours_loss - llama_loss) < 1e-4
        eager = copy.deepcopy(model)
        compiled = self.compile_like_trainer(model)
        models = {"fullband": (model, steps.fullband_loss(model, tokens)),
                  "fullband-eager": (eager, steps.fullband_loss(eager, tokens)),
                  "llama": (llama, steps.transformers_loss(llama, tokens)),
                  "gpt2": (gpt2, steps.transformers_loss(gpt2, tokens))}
        if not compiled:
            del models["fullband-eager"]  # the same step twice
        cases = {}
        for name, (net, loss_fn) in models.items():
            optimizer, params = steps.adamw(net), list(net.parameters())
            cases[name] = lambda loss_fn=loss_fn, optimizer=optimizer, params=params: steps.optimizer_step(
                loss_fn, optimizer, params)
        cases["matmul"], peak_flops, _ = matmul_case(self.device)  # the peak of each round (it drifts)
        self.say("bench: train (the first fullband step compiles its blocks) ...")
        times = self.times["train"] = interleaved(cases, self.cfg.rounds, self.device, reps=c.steps_per_round,
                                                  warmup=2)
        n_tokens = tokens.numel()
        flops = {"fullband": flops_per_token(steps.baseline_twin(model).num_parameters(), c.n_layers, c.d_model,
                                             c.seq_len),
                 "llama": flops_per_token(sum(p.numel() for p in llama.parameters()), c.n_layers, c.d_model, c.seq_len),
                 "gpt2": flops_per_token(sum(p.numel() for p in gpt2.parameters()), c.n_layers, c.d_model, c.seq_len)}
        flops["fullband-eager"] = flops["fullband"]
        how = f"compiled blocks, as a study's runs of {COMPILE_MIN_CPU_STEPS}+ steps" if compiled else "eager"
        labels = {"fullband": f"fullband train step (1 pass, bare, {how})",
                  "fullband-eager": "fullband train step (1 pass, bare, eager)",
                  "llama": "LlamaForCausalLM train step, same weights", "gpt2": "GPT2LMHeadModel train step, same dims"}
        for name in models:
            seconds = statistics.median(times[name])
            self.rows.append(Row("train", labels[name], 1000 * seconds, f"{n_tokens / seconds / 1e3:.1f}k tok/s",
                                 of_limit=share_of_peak(times, name, flops[name] * n_tokens, peak_flops),
                                 check=mfu(self.device, flops[name] * n_tokens, seconds)))
        self.rows.append(Row("train", "speed fullband / LlamaForCausalLM", ratio=ratio(times, "llama", "fullband"),
                             target=">= 1.3", check=f"same loss ({ours_loss:.5f} vs {llama_loss:.5f})"
                             if same_loss else f"LOSS DIFFERS ({ours_loss:.5f} vs {llama_loss:.5f})", ok=same_loss))
        if compiled:
            self.rows.append(Row("train", "speed fullband eager / LlamaForCausalLM",
                                 ratio=ratio(times, "llama", "fullband-eager")))
        self.rows.append(Row("train", "speed fullband / GPT2LMHeadModel", ratio=ratio(times, "gpt2", "fullband")))
        with tempfile.TemporaryDirectory() as tmp:
            trainer_step, bare_step = steps.trainer_and_bare_step(eager, tokens, tmp)
            overhead = self.times["trainer"] = interleaved({"trainer": trainer_step, "bare": bare_step},
                                                           self.cfg.rounds, self.device, reps=c.steps_per_round,
                                                           warmup=2)
        self.rows.append(Row("train", "Trainer.train_step / bare step time", 1000 * statistics.median(
            overhead["trainer"]), ratio=ratio(overhead, "trainer", "bare"), target="<= 1.05"))

    def optim(self) -> None:
        """The whole training step with AdamW, Muon and NorMuon at compare's default, the optimizer's share of it,
        its model FLOP/s against the matmul peak, and (Nor)Muon's time over AdamW's."""
        from fullband.experiments.core.lm.config import LMRunsConfig
        from fullband.training.optim import build_optimizer, ns_dtype_for, optimizer_ns_dtype

        c = self.cfg.optim
        model, tokens = steps.train_model(c, self.device)
        base = LMRunsConfig().optim  # compare's learning rates, weight decays and fusion LR multiplier
        variants = {"adamw": (dataclasses.replace(base, optimizer="adamw"), contextlib.nullcontext),
                    "muon": (dataclasses.replace(base, optimizer="muon", ns_dtype=c.ns_dtype), contextlib.nullcontext),
                    "normuon": (dataclasses.replace(base, optimizer="normuon", ns_dtype=c.ns_dtype),
                                contextlib.nullcontext)}
        if self.device.type == "cpu" and ns_dtype_for(variants["muon"][0], self.device) != "float32":
            # What CPUs without bf16 instructions run (auto's choice there), timed here too.
            variants["muon-fp32"] = (dataclasses.replace(base, optimizer="muon", ns_dtype="float32"),
                                     contextlib.nullcontext)
        if c.emulated_bf16 and self.device.type == "cpu":
            variants["muon-emulated"] = (dataclasses.replace(base, optimizer="muon", ns_dtype="bfloat16"),
                                         steps.without_onednn)
        # The blocks as compare's default trains them (train.compile 'auto', decided by its shortest run), and
        # where that compiles, AdamW with eager blocks beside it.
        compiled = self.compare_compiles()
        if compiled:
            variants["adamw-eager"] = variants["adamw"]
        cases, optimizer_times, labels = {}, {}, {}
        for name, (optim_cfg, context) in variants.items():
            net = copy.deepcopy(model)  # each its own weights: the optimizers move them apart
            if compiled and name != "adamw-eager":
                net.compile_blocks()
            optimizer, params = build_optimizer(net, optim_cfg), list(net.parameters())
            seconds = optimizer_times[name] = []
            cases[name] = (lambda net=net, optimizer=optimizer, params=params, seconds=seconds, context=context:
                           steps.timed_optimizer_step(steps.fullband_loss(net, tokens, c.passes), optimizer, params,
                                                      seconds, optimizer_context=context))
            ns = optimizer_ns_dtype(optimizer)
            labels[name] = {"adamw": "AdamW", "muon": f"Muon (NS {ns})", "normuon": f"NorMuon (NS {ns})",
                            "muon-fp32": "Muon (NS float32 forced)",
                            "muon-emulated": "Muon (NS bf16 forced, emulated)", "adamw-eager": "AdamW"}[name]
        steppers = list(cases)
        # The peak drifts with the machine's clock and other tenants: a matmul in every round, each round's share
        # against it; and the step's weight products alone, the ceiling of its GEMMs' shapes.
        cases["matmul"], peak_flops, _ = matmul_case(self.device)
        twin = steps.baseline_twin(model)  # a single pass runs no fusion: the baseline's weights and FLOPs
        cases["products"], product_flops = steps.training_products(twin, tokens.numel())
        warmup, reps = 2, c.steps_per_round
        self.say("bench: optim (the compiled case compiles its blocks first) ...")
        times = self.times["optim"] = interleaved(cases, self.cfg.rounds, self.device, reps=reps, warmup=warmup)
        flops = c.passes * flops_per_token(twin.num_parameters(), c.n_layers, c.d_model, c.seq_len) * tokens.numel()

        blocks = "compiled blocks" if compiled else "eager blocks"
        for name in steppers:
            rounds = optimizer_times[name][warmup:]  # reps calls per round, after the warm-up calls
            per_round = [statistics.mean(rounds[r * reps:(r + 1) * reps]) for r in range(self.cfg.rounds)]
            share = statistics.median(o / s for o, s in zip(per_round, times[name], strict=True))
            seconds = statistics.median(times[name])
            how = "eager blocks" if name == "adamw-eager" else blocks
            self.rows.append(Row("optim", f"train step ({c.passes} pass, {how}), {labels[name]}", 1000 * seconds,
                                 f"{tokens.numel() / seconds / 1e3:.1f}k tok/s",
                                 target="" if name == "adamw-eager" else ">= 45%",
                                 of_limit=share_of_peak(times, name, flops, peak_flops),
                                 check=f"optimizer {share:.0%} of it" + (f"; {m}" if (m := mfu(self.device, flops,
                                                                                               seconds)) else "")))
        self.rows.append(Row("optim", "its weights' matrix products alone (ceiling)",
                             1000 * statistics.median(times["products"]),
                             f"{product_flops / statistics.median(times['products']) / 1e9:.1f} GFLOP/s",
                             of_limit=share_of_peak(times, "products", product_flops, peak_flops)))
        self.rows.append(Row("optim", "matmul float32 peak, timed in the same rounds",
                             1000 * statistics.median(times["matmul"]),
                             f"{peak_flops / statistics.median(times['matmul']) / 1e9:.1f} GFLOP/s"))
        if c.passes == 1:  # the products are one pass's
            self.rows.append(Row("optim", f"AdamW step ({blocks}) beyond its weight products", 1000 * statistics.median(
                t - g for t, g in zip(times["adamw"], times["products"], strict=True))))
        for name in ("muon", "normuon", "muon-fp32", "muon-emulated"):
            if name in cases:
                self.rows.append(Row("optim", f"{labels[name]} / AdamW step time",
                                     ratio=ratio(times, name, "adamw"), target="" if name == "muon-emulated"
                                     else "<= 1.2"))
        if compiled:
            self.rows.append(Row("optim", "AdamW eager / compiled blocks step time",
                                 ratio=ratio(times, "adamw-eager", "adamw")))
        workers = LMRunsConfig().workers
        if self.device.type == "cpu" and workers > 1:
            # compare's runs train several at a time, the threads shared out: what the study gets of the machine.
            chosen = {name: variants[name][0] for name in dict.fromkeys(("adamw", base.optimizer))}
            self.say(f"bench: optim, {workers} runs at a time as compare trains them ...")
            per_worker, threads = time_in_workers(chosen, c, compiled, workers, self.cfg.rounds, self.cfg.seed)
            for i, worker_times in enumerate(per_worker):
                self.times[f"optim-worker{i}"] = worker_times
            each = f"{threads} thread{'s' if threads > 1 else ''} each"
            for name in chosen:
                medians = [statistics.median(w[name]) for w in per_worker]
                share = combined_share(per_worker, name, flops, peak_flops)
                self.rows.append(Row("optim", f"train step as compare runs it ({workers} at a time, {each}), "
                                     f"{labels[name]}", 1000 * statistics.median(medians),
                                     f"{sum(tokens.numel() / s for s in medians) / 1e3:.1f}k tok/s in all",
                                     target=">= 45%", of_limit=f"{100 * share:.1f}% matmul"))

    def compile_like_trainer(self, model: FullBandwidthLM) -> bool:
        """Compile ``model``'s blocks when a long training run on this device would (train.compile 'auto')."""
        if not should_compile("auto", self.device, COMPILE_MIN_CPU_STEPS):
            return False
        model.compile_blocks()
        return True

    def compare_compiles(self) -> bool:
        """Whether compare's default study compiles the blocks on this device: its own decision
        (``fullband.experiments.core.lm.runs.study_compile``)."""
        from fullband.experiments.core.lm.config import LMRunsConfig
        from fullband.experiments.core.lm.runs import study_compile

        return study_compile(LMRunsConfig(device=str(self.device))) == "true"

    def passes(self) -> None:
        c = self.cfg.train
        model, tokens = self._train_model()
        self.compile_like_trainer(model)
        optimizer, params = steps.adamw(model), list(model.parameters())
        cases = {f"{k}-pass": (lambda k=k: steps.optimizer_step(steps.fullband_loss(model, tokens, k), optimizer,
                                                                 params)) for k in (1, 2, 3)}
        times = self.times["passes"] = interleaved(cases, self.cfg.rounds, self.device, reps=c.steps_per_round,
                                                   warmup=2)
        for k, target in ((2, "<= 2.1"), (3, "<= 3.15")):
            self.rows.append(Row("passes", f"{k}-pass / 1-pass train step time", 1000 * statistics.median(
                times[f"{k}-pass"]), ratio=ratio(times, f"{k}-pass", "1-pass"), target=target))

    def decode(self) -> None:
        from fullband.generation.static import COMPILE_FAILED

        c = self.cfg.decode
        config = ModelConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                             max_seq_len=c.prompt_len + c.new_tokens, feedback=True)
        model = FullBandwidthLM(config).to(self.device).eval()
        fuses_here = self.device.type == "cpu" and fused_inference_enabled()
        llama = steps.llama_twin(model).eval()
        weight_bytes = sum(p.numel() * p.element_size() for p in steps.baseline_twin(model).parameters())
        # The machine's bandwidth drifts (other tenants): a copy in every round, each round's share against it.
        copy, moved = copy_case(self.cfg.limit_mib, self.device)
        for batch in c.batch_sizes:
            prompts = torch.randint(0, c.vocab_size, (batch, c.prompt_len), device=self.device)
            cases = {"standard": lambda p=prompts: steps.greedy_fullband(model, p, c.new_tokens, "standard"),
                     "generate": lambda p=prompts: steps.greedy_transformers(llama, p, c.new_tokens),
                     "soft": lambda p=prompts: steps.greedy_fullband(model, p, c.new_tokens, "soft"),
                     "products": steps.weight_products(model, batch, c.new_tokens),
                     "copy": copy}
            variants = {}  # the step with one of its optimisations off, in the same rounds
            if fuses_here:
                variants["unfused"] = (lambda: fused_inference(False), "fullband greedy, fused inference off",
                                       "speed fused / unfused inference")
                if packed_weights_enabled() and batch >= PACK_MIN_ROWS:
                    variants["unpacked"] = (lambda: packed_weights(False), "fullband greedy, packed weights off",
                                            "speed packed / plain weight layout")
            for step in c.steps:
                variants[step] = (contextlib.nullcontext, f"fullband greedy, {step} step",
                                  f"speed eager / {step} step")
            for name, (context, _, _) in variants.items():
                cases[name] = (lambda p=prompts, context=context, step=name if name in c.steps else "eager":
                               steps.greedy_fullband(model, p, c.new_tokens, "standard", step=step, context=context))
            with torch.no_grad():
                with warnings.catch_warnings(record=True) as caught:  # the warm-up (compiles the compiled step)
                    warnings.simplefilter("always")
                    tokens = {name: cases[name]() for name in ("standard", "generate", "soft", *variants)}
                for w in caught:  # passed on; a compiled step that fell back is also named in its row
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
                fell_back = any(COMPILE_FAILED in str(w.message) for w in caught)
                times = self.times[f"decode-batch{batch}"] = interleaved(cases, self.cfg.rounds, self.device,
                                                                         warmup=0)
            same = torch.equal(tokens["standard"], tokens["generate"])
            generated = batch * c.new_tokens
            for name, label in (("standard", "fullband greedy (standard)"), ("generate", "LlamaForCausalLM.generate"),
                                ("soft", "fullband greedy (soft)"),
                                *((name, label) for name, (_, label, _) in variants.items()),
                                ("products", "its weights' matrix products alone (ceiling)")):
                seconds = statistics.median(times[name])
                # Each decoding step reads every weight once: a bandwidth bound at small batches. The share is
                # the median over rounds of the step's weight traffic against that round's copy bandwidth.
                share = statistics.median(weight_bytes * c.new_tokens / t / (moved / copy_t)
                                          for t, copy_t in zip(times[name], times["copy"], strict=True))
                self.rows.append(Row("decode", f"{label}, batch {batch}", 1000 * seconds,
                                     f"{generated / seconds:.1f} tok/s", of_limit=f"{100 * share:.1f}% mem bw",
                                     target=">= 60%" if name in ("standard", "compiled") and batch == 1 else ""))
            self.rows.append(Row("decode", f"speed fullband / generate, batch {batch}",
                                 ratio=ratio(times, "generate", "standard"),
                                 target=">= 1.3" if batch >= 8 else ">= 1.0",
                                 check="identical tokens" if same else "TOKENS DIFFER", ok=same))
            self.rows.append(Row("decode", f"speed soft / standard, batch {batch}",
                                 ratio=ratio(times, "standard", "soft"), target=">= 0.98"))
            for name, (_, _, label) in variants.items():
                identical = torch.equal(tokens[name], tokens["standard"])
                uncompiled = name == "compiled" and fell_back  # timed, but as the static step uncompiled
                check = ("identical tokens" if identical else "TOKENS DIFFER") + ("; FELL BACK TO UNCOMPILED"
                                                                                  if uncompiled else "")
                self.rows.append(Row("decode", f"{label}, batch {batch}", ratio=ratio(times, name, "standard"),
                                     check=check, ok=identical and not uncompiled))
            self.rows.append(Row("decode", f"standard step beyond its matrix products, batch {batch}",
                                 1000 * statistics.median((t - g) / c.new_tokens for t, g in zip(
                                     times["standard"], times["products"], strict=True)),
                                 figure="ms per token"))

    def exact(self) -> None:
        c = self.cfg.exact
        if c.checkpoint:
            from fullband.families import load_any

            model = load_any(c.checkpoint, device=str(self.device)).eval()
        else:  # the train section's (compare's default) dimensions, random weights
            t = self.cfg.train
            config = ModelConfig(vocab_size=steps.BYTE_VOCAB, d_model=t.d_model, n_layers=t.n_layers,
                                 n_heads=t.n_heads, max_seq_len=c.seq_len, feedback=True)
            model = FullBandwidthLM(config).to(self.device).eval()
        tokens = torch.randint(0, model.config.vocab_size, (c.batch_size, c.seq_len), device=self.device)
        tol = f"tol {c.tol:g}"
        methods = {"sequential": dict(method="sequential"),
                   f"chunked({c.chunk_size})": dict(method="chunked", chunk_size=c.chunk_size),
                   f"chunked({c.chunk_size}), {tol}": dict(method="chunked", chunk_size=c.chunk_size, tol=c.tol),
                   f"jacobi, {tol}": dict(method="jacobi", tol=c.tol)}
        with torch.no_grad():
            outputs = {name: model.forward_exact(tokens, 1, **kwargs) for name, kwargs in methods.items()}
            cases = {name: (lambda kwargs=kwargs: model.forward_exact(tokens, 1, **kwargs))
                     for name, kwargs in methods.items()}
            # A call takes seconds at full size: at most 3 rounds here (the table's header says so).
            times = self.times["exact"] = interleaved(cases, min(self.cfg.rounds, 3), self.device, warmup=0)
        reference = outputs["sequential"].logits
        for name in methods:
            difference = (outputs[name].logits - reference).abs().max().item()
            self.rows.append(Row("exact", f"forward_exact {name} / sequential time",
                                 1000 * statistics.median(times[name]), f"{outputs[name].passes} passes",
                                 ratio=ratio(times, name, "sequential"), check=f"max|dlogit| {difference:.1e}"))
        rows = dict(zip(methods, self.rows[-len(methods):], strict=True))
        for tol_value in (None, c.tol):  # what auto runs here: one of the rows above, not timed again
            chosen = auto_exact_method(self.device, tol_value)
            row = rows[next(name for name, kwargs in methods.items() if kwargs["method"] == chosen
                            and ("tol" in kwargs) == (tol_value is not None and chosen != "sequential"))]
            label = f"forward_exact auto{', ' + tol if tol_value else ''} (= {chosen} here)"
            self.rows.append(dataclasses.replace(row, case=label))


def mfu(device: torch.device, step_flops: float, seconds: float) -> str:
    """The step's model FLOP/s against the device's rated float32 peak (``fullband.training.metrics``: the GPUs it
    knows; "" elsewhere, where the matmul timed beside it is the limit), as nanoGPT prints its MFU."""
    from fullband.training.metrics import peak_flops

    peak = peak_flops(device, torch.float32)
    return f"MFU {100 * step_flops / seconds / peak:.1f}% of float32 peak" if peak else ""


def share_of_peak(times: dict[str, list[float]], name: str, case_flops: float, peak_flops: float) -> str:
    """Case ``name``'s FLOP/s as a share of the matmul timed in the same rounds (``times["matmul"]``, one
    ``peak_flops`` product a call): the median over rounds, so a peak that drifts between rounds does not move it."""
    share = statistics.median(case_flops / t / (peak_flops / peak_t)
                              for t, peak_t in zip(times[name], times["matmul"], strict=True))
    return f"{100 * share:.1f}% matmul"


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``cfg``'s sections; write ``cfg.json`` when set; returns what it holds."""
    results = Bench(cfg, progress).run()
    if cfg.json:
        write_json(cfg.json, results)
    return results


COLUMNS = (("section", 7, "<"), ("case", 52, "<"), ("ms", 9, ">"), ("figure", 16, ">"), ("ratio", 7, ">"),
           ("target", 8, ">"), ("of_limit", 13, ">"), ("check", 0, "<"))


def table(results: dict[str, Any]) -> str:
    """The rows as one fixed-width text table, headed by the machine, its load and the settings."""
    m, cfg = results["machine_at_start"], results["config"]
    features = m.get("cpu_features", [])
    absent = [f for f in CPU_FEATURES if f not in features]
    lines = [f"# fullband bench: torch {m['torch']}, {results['device']}, {m['torch_threads']} threads on "
             f"{m['usable_cores']} usable cores ({m['cpu']}); load average {m.get('load_average')} at start, "
             f"{results['load_average_at_end']} at end; preset {cfg['preset']}, medians of {cfg['rounds']} "
             f"interleaved rounds (exact: at most 3); {results['seconds']:.0f} s",
             f"# CPU features: {' '.join(features) or 'none'}; absent: {' '.join(absent) or 'none'} (bf16 matmuls "
             "are native with avx512_bf16 or amx_bf16; emulated = oneDNN off, as without AVX-512)",
             "# ratio: what the case says (speed = the other's time / ours: > 1 = ours faster; time = the first's "
             "time / the second's)"]
    header = " ".join(f"{name:{align}{width}}" for name, width, align in COLUMNS).rstrip()
    lines += [header, "-" * len(header)]
    for row in results["rows"]:
        cells = {**row, "ms": "" if row["ms"] is None else f"{row['ms']:.1f}",
                 "ratio": "" if row["ratio"] is None else f"{row['ratio']:.2f}"}
        lines.append(" ".join(f"{cells[name]!s:{align}{width}}" for name, width, align in COLUMNS).rstrip())
    return "\n".join([*lines, *decode_summary(results["rows"])])


def decode_summary(rows: list[dict[str, Any]]) -> list[str]:
    """The decoding figures the speed targets name, from the decode rows (none without them): batch-1 greedy
    decoding's share of the copy bandwidth, soft/standard and fullband/generate speed at each batch size."""
    cases = {r["case"]: r for r in rows if r["section"] == "decode"}
    batches = [int(case.rsplit(" ", 1)[1]) for case in cases if case.startswith("speed soft / standard, batch ")]
    if not batches:
        return []
    parts = []
    if (one := cases.get("fullband greedy (standard), batch 1")) is not None:
        compiled = cases.get("fullband greedy, compiled step, batch 1")
        parts.append(f"batch-1 greedy (standard) {one['of_limit'].replace(' mem bw', '')}"
                     + (f", compiled step {compiled['of_limit'].replace(' mem bw', '')}" if compiled else "")
                     + " of the copy bandwidth (target >= 60%)")
    parts.append("soft/standard " + ", ".join(f"{cases[f'speed soft / standard, batch {b}']['ratio']:.2f} at batch "
                                             f"{b}" for b in batches) + " (target >= 0.98)")
    parts.append("fullband/generate " + ", ".join(f"{cases[f'speed fullband / generate, batch {b}']['ratio']:.2f} at "
                                                 f"batch {b}" for b in batches))
    return [f"# decoding: {'; '.join(parts)}"]
