"""The config and presets of a study of language-model runs (``fullband compare``, and each run of ``fullband
recipe``), torch-free: the command line checks them before importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from fullband.config import (
    EXACT_METHODS,
    device_field,
    doc,
    is_int,
    is_number,
    require,
    resume_field,
    threads_field,
)
from fullband.experiments.core.config import StudyConfig
from fullband.training.config import DataConfig, OptimConfig, ScheduleConfig, TrainConfig, TrainModelConfig

# Presets of the language-model studies: what each changes relative to LMRunsConfig's defaults, which *are* the
# "default" preset (so ``--help`` shows them). Precedence: defaults < preset < config file < command line
# (or < the arguments given in Python): see apply_preset.
LM_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # 2 CPU cores, <= ~10 minutes including evaluation
    "smoke": {  # tests and CI: seconds
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
        "train": {"token_budget": 1280, "batch_size": 4, "seq_len": 32, "eval_batches": 1},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "budgets": [1.0, 1.5, 2.0], "seeds": 1, "workers": 1, "stability_ablation": True,
        "eval_windows": 8, "eval_batch_size": 8, "stability_windows": 4, "stability_passes": 20,
    },
    # Issue 29, the token question at a longer horizon: the default's model and recipe trained 7.4x longer, 4.1
    # tokens per parameter at 1x (3,801,088 tokens = 1856 steps; the fusion model has 927,104 parameters). The same
    # d128 model as the default, not a narrower one: cost grows with parameters x tokens, so d64 (242k parameters,
    # 0.97M tokens) would cost ~5% as much, but the recipe study measured the gap moving with width and d64's seed
    # spread 3x d128's, so the run would mix training length with width; d128 changes only the length (and keeps
    # the >= 7x budget the issue asks for). Estimate at the default report's eager 0.48 s/step (baseline) and 0.92
    # (feedback): 2 x (5 x 1856 x 0.48 + 1856 x (0.92 + 0.87)) s / 2 workers = ~2.2 h on 2 cores; ~3.6 h at the
    # rates of a probe under heavier load (docs/LOG.md).
    # Checkpoints every 200 steps, so `--resume true` loses at most 200 steps of a killed run. Eager, as its
    # committed report (docs/results/compare-long, one H200) was trained: compile="auto" would compile every run
    # here (--train.compile true may save 4-19%, not measured in parallel workers).
    "long": {
        "train": {"token_budget": 3_801_088, "checkpoint_every": 200, "keep_last": 1, "compile": "false"},
        "budgets": [0.5, 1.0, 1.5, 2.0], "stability_ablation": True, "train_eval_points": 16,
    },
    # One GPU: 10.7M parameters (11.0M with the fusion), 2M tokens at 1x (245 steps of 16 x 512); the 1.5x baseline
    # sees 0.7 of the Shakespeare train split (4.34M byte tokens). 1.48e15 training FLOPs in all, evaluation up to
    # 6.7e15 more (exact mode solved to exactness); benchmarks/compare_flops.py counts them, docs/gpus.md.
    "gpu": {
        "model": {"d_model": 384, "n_layers": 6, "n_heads": 6},
        "train": {"token_budget": 2_000_000, "batch_size": 16, "seq_len": 512},
        "optim": {"lr": 1e-3, "warmup_steps": 50},
        "eval_windows": 512, "eval_batch_size": 64, "stability_windows": 32, "exact_method": "jacobi",
    },
}


@dataclass
class LMRunsConfig(StudyConfig):
    """Baselines at several token budgets and full-bandwidth models at 1x, evaluated on the test split in every mode
    (a prepared shard directory as ``data.source``: its validation split), plus the stability diagnostic: the runs of
    ``fullband compare`` (whose config is this one) and of each variant of ``fullband recipe``.

    ``LMRunsConfig(preset="smoke")``, a config file and the command line apply a preset the same way
    (:func:`apply_preset`); the sections' defaults below are the "default" preset.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = LM_PRESETS
    DEVICE_PER_PROCESS: ClassVar[bool] = True  # "auto" resolved by each run's process (the workers)
    SECTIONS: ClassVar[tuple[str, ...]] = ("model", "data", "train", "optim", "schedule")
    TUPLES: ClassVar[tuple[str, ...]] = ("budgets", "fused_passes")

    preset: str = doc("default", f"Settings to start from: one of {tuple(LM_PRESETS)}. default = 2 CPU cores in "
                      "<= ~10 min; long = the default model at 4.1 tokens/parameter (~2.2 h on 2 cores, resumable); "
                      "smoke = seconds (tests/CI); gpu = one GPU: d_model 384, 6 layers, seq_len 512, 2M tokens "
                      "at 1x (docs/gpus.md). Values from a config file or the command line override the preset's.")
    model: TrainModelConfig = field(default_factory=lambda: TrainModelConfig(d_model=128, n_layers=4, n_heads=4))
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        token_budget=512_000, batch_size=16, seq_len=128, eval_batches=4, checkpoint_every=0))  # 250 steps at 1x
    # The recipe: fullband train's defaults (fullband.training.recipes says what it is and why).
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    budgets: tuple[float, ...] = doc(
        (0.5, 1.0, 1.5), "Baseline token budgets as multiples of train.token_budget (the unit, 1x); the "
        "full-bandwidth models train to 1x. At least two, so the baseline's loss-vs-tokens curve can be fitted. "
        "(Each run sets model.feedback and its own budget itself; train.max_steps and train.eval_every are unused.)")
    seeds: int = doc(2, "Repeat every run with seeds train.seed, train.seed+1, ...; >1 reports mean ± sd.")
    fused_passes: tuple[int, ...] = doc(
        (1, 2, 4), "Fused prefill modes to evaluate: k extra fused passes over each window (standard = 0).")
    exact_method: str = doc(
        "auto", f"Exact mode: one of {EXACT_METHODS}: auto (the fastest for the device: sequential on a CPU; "
        "see fullband.model.recurrence.auto_exact_method), sequential (one position at a time with the KV cache, "
        "the definition), jacobi (whole-window passes until max|Δh| < exact_tol) or chunked (Jacobi per chunk).")
    exact_tol: float = doc(1e-4, "jacobi/chunked: stop once max|h^(k) - h^(k-1)| < exact_tol; 0 = run until exact.")
    exact_chunk_size: int = doc(64, "chunked: positions per chunk.")
    exact_check_windows: int = doc(
        4, "jacobi/chunked: windows on which exact mode is checked against the sequential definition; 0 = skip.")
    eval_windows: int = doc(256, "Test-split windows (train.seq_len tokens each, spread evenly over the split).")
    eval_batch_size: int = doc(32, "Windows per evaluation batch.")
    stability_passes: int = doc(100, "Stability diagnostic: fused prefill passes 1..N (the paper's Figure 3 uses "
                                "1000; then raise stability_seq_len, see there).")
    stability_windows: int = doc(16, "Stability diagnostic: validation-split windows.")
    stability_seq_len: int | None = doc(
        None, "Stability diagnostic window length; none = train.seq_len. A window of T tokens is exact after T "
        "passes, so passes beyond T show nothing new; at most model.max_seq_len.")
    stability_ablation: bool = doc(
        False, "Also train the 1-/2-pass-only model (schedule.pass_mix = 1.0) for the stability diagnostic.")
    train_eval_points: int = doc(
        0, "Validate the feedback runs (1, 2 and 3 passes) and the 1x baseline this many times during training, for "
        "the fused-vs-plain and feedback-vs-baseline gaps against training tokens; 0 = only at the end.")
    workers: int = doc(
        2, "Training runs at a time, each in its own process with the torch threads shared out (2 on 2 cores: "
        "small models use one core poorly). The numbers do not depend on it.")
    out_dir: str = doc("runs/compare", "Run directory: one sub-directory per training run, report.md, "
                       "results.json and the plots.")
    resume: str = resume_field(
        "with the same settings: runs it finished and evaluated are kept, and a run it was training continues from "
        "its latest checkpoint (train.checkpoint_every), bit for bit")
    device: str = device_field("for training and evaluation")
    threads: str = threads_field()

    def validate(self) -> None:
        c = self
        c.budgets = tuple(sorted(float(b) for b in c.budgets))
        require(len(c.budgets) >= 2 and len(set(c.budgets)) == len(c.budgets) and all(
            is_number(b) and b > 0 for b in c.budgets), "budgets", c.budgets,
            "must be at least two distinct multiples > 0 of train.token_budget")
        require(c.train.token_budget is not None, "train.token_budget", c.train.token_budget,
                "must be set: it is the 1x budget every run is measured in")
        require(c.train.seq_len <= c.model.max_seq_len, "train.seq_len", c.train.seq_len,
                f"must be at most model.max_seq_len={c.model.max_seq_len}")
        require(c.data.format == "text", "data.format", c.data.format, "must be 'text' (language modelling)")
        require(len(c.fused_passes) >= 1 and all(is_int(k) and k >= 1 for k in c.fused_passes), "fused_passes",
                c.fused_passes, "must be a non-empty list of integers >= 1")
        require(c.exact_method in EXACT_METHODS, "exact_method", c.exact_method, f"must be one of {EXACT_METHODS}")
        require(is_number(c.exact_tol) and c.exact_tol >= 0, "exact_tol", c.exact_tol,
                "must be >= 0 (0 = until exact)")
        for name, low in (("seeds", 1), ("exact_chunk_size", 1), ("exact_check_windows", 0), ("eval_windows", 1),
                          ("eval_batch_size", 1), ("stability_passes", 1), ("stability_windows", 1),
                          ("train_eval_points", 0), ("workers", 1)):
            value = getattr(c, name)
            require(is_int(value) and value >= low, name, value, f"must be an integer >= {low}")
        if c.stability_seq_len is not None:
            require(is_int(c.stability_seq_len) and 2 <= c.stability_seq_len <= c.model.max_seq_len,
                    "stability_seq_len", c.stability_seq_len,
                    f"must be in 2..model.max_seq_len={c.model.max_seq_len}")
        for name in ("stability_ablation", "resume"):
            require(isinstance(getattr(c, name), bool), name, getattr(c, name), "must be true or false")
