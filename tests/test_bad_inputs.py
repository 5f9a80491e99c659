"""Bad input never crashes: the command line, run as a subprocess exactly as a user runs it, answers each of these
mistakes (options, config files, data files, tokenizer files, prompts, token ids, devices, checkpoints: missing,
truncated, wrong dtype, wrong shapes, mismatched config) with a non-zero exit status and one line on stderr that
names what to change, never a traceback, and without changing any file that existed before.

The cases run a few at a time in one module fixture (subprocess start-up, mostly importing torch, is the cost);
each case is then its own test. Every cache (fullband's, transformers') lives in the module's temporary directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import make_model
from safetensors.torch import load_file, save_file

from fullband.data import ByteTokenizer


@dataclass
class Case:
    name: str
    argv: list[str]  # "{w}" stands for the shared world directory, "{c}" for this case's own directory
    says: str  # the message must contain this: the field, file or option to change
    setup: str | None = None  # name of a function below that prepares {c}
    needs: tuple[str, ...] = field(default_factory=tuple)  # optional modules the case needs


GEN = ["generate", "--checkpoint", "{c}/ckpt", "--prompt", "To be"]  # a case's own (mutated) checkpoint
TRAIN = ["train", "--out_dir", "{c}/run", "--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads", "2",
         "--train.batch_size", "2", "--train.seq_len", "16", "--train.max_steps", "1", "--device", "cpu"]

CASES = [
    # --- the command line itself
    Case("unknown-command", ["bogus"], "invalid choice: 'bogus'"),
    Case("unknown-option", ["generate", "--checkpoint", "x", "--max_new_tokenz", "3"], "did you mean --max_new_tokens"),
    Case("not-an-int", ["generate", "--checkpoint", "x", "--max_new_tokens", "abc"], "--max_new_tokens='abc'"),
    Case("negative-count", ["generate", "--checkpoint", "x", "--max_new_tokens", "-1"], "max_new_tokens=-1"),
    Case("unknown-mode", ["generate", "--checkpoint", "x", "--decode.mode", "fast"], "mode='fast'"),
    Case("no-checkpoint", ["generate", "--prompt", "hi"], "--checkpoint DIR"),
    Case("negative-temperature", ["generate", "--checkpoint", "x", "--decode.temperature", "-1"], "temperature=-1"),
    Case("top-p-zero", ["generate", "--checkpoint", "x", "--decode.top_p", "0"], "top_p=0"),
    Case("negative-top-k", ["generate", "--checkpoint", "x", "--decode.top_k", "-3"], "top_k=-3"),
    Case("retired-prefill-passes", ["generate", "--checkpoint", "x", "--decode.prefill_passes", "2"],
         "use --decode.mode fused:K"),
    Case("bare-fused", ["generate", "--checkpoint", "x", "--decode.mode", "fused"], "write fused:K"),
    Case("zero-exact-chunk", ["generate", "--checkpoint", "x", "--decode.exact_chunk_size", "0"], "exact_chunk_size=0"),
    Case("not-a-bool", ["generate", "--checkpoint", "x", "--stop_at_eos", "maybe"], "--stop_at_eos"),
    Case("misspelt-device", [*GEN, "--device", "gpu"], "device='gpu'"),
    Case("cuda-7", [*GEN, "--device", "cuda:7"], "device='cuda:7'", setup="native"),
    Case("mps-unavailable", [*GEN, "--device", "mps"], "device='mps'", setup="native"),
    Case("train-cuda-7", [*TRAIN, "--device", "cuda:7"], "device='cuda:7'"),
    Case("heads-do-not-divide", [*TRAIN, "--model.n_heads", "5"], "n_heads=5"),
    Case("zero-layers", [*TRAIN, "--model.n_layers", "0"], "n_layers=0"),
    # --- recipe settings (the Recipe issue): Muon on a 1-D tensor, a mix that does not sum to 1, a feedback phase
    # outside the run, an unknown optimiser, an unknown input form
    Case("muon-on-a-gain", [*TRAIN, "--data.source", "{c}/text.txt", "--optim.optimizer", "muon",
                            "--optim.muon_params", "norm"], "muon_params entry 'norm'", setup="a_text"),
    Case("pass-mix-sum", [*TRAIN, "--schedule.pass_mix", "0.5,0.4"], "pass_mix=(0.5, 0.4)"),
    Case("feedback-after-the-run", [*TRAIN, "--schedule.feedback_end", "1.5"], "feedback_end=1.5"),
    Case("feedback-phase-empty", [*TRAIN, "--schedule.feedback_start", "0.5", "--schedule.feedback_end", "0.5"],
         "feedback_end=0.5"),
    Case("unknown-optimizer", [*TRAIN, "--optim.optimizer", "sgd"], "optimizer='sgd'"),
    Case("unknown-input-form", [*TRAIN, "--model.input_norm", "both"], "input_norm='both'"),
    Case("seq-len-1", [*TRAIN, "--train.seq_len", "1"], "seq_len=1"),
    Case("zero-steps", [*TRAIN, "--train.max_steps", "0"], "max_steps=0"),
    Case("negative-lr", [*TRAIN, "--optim.lr", "-1"], "lr=-1"),
    Case("unknown-data-format", [*TRAIN, "--data.format", "xml"], "data.format='xml'"),
    Case("unknown-tokenizer", [*TRAIN, "--data.tokenizer", "wordpiece"], "data.tokenizer='wordpiece'"),
    Case("bad-wandb-project", [*TRAIN, "--train.wandb_project", "my project"], "wandb_project='my project'"),
    Case("retrofit-source-without-hf", [*TRAIN, "--retrofit.feedback_source", "2"], "retrofit.feedback_source"),
    Case("empty-hf-path", [*TRAIN, "--init_from", "hf:"], "init_from='hf:'"),
    Case("out-dir-under-a-file", ["train", "--out_dir", "{c}/a-file/run", "--train.max_steps", "1", "--device",
                                  "cpu"], "pick another --out_dir", setup="a_file"),
    Case("eval-no-tasks", ["eval", "--checkpoint", "x", "--tasks", ""], "tasks=()"),
    Case("eval-bad-dtype", ["eval", "--checkpoint", "x", "--tasks", "t", "--dtype", "float8"], "dtype='float8'"),
    Case("eval-zero-batch", ["eval", "--checkpoint", "x", "--tasks", "t", "--batch_size", "0"], "batch_size=0"),
    Case("compare-unknown-preset", ["compare", "--preset", "huge"], "preset='huge'"),
    Case("compare-one-budget", ["compare", "--preset", "smoke", "--budgets", "1"], "budgets="),
    Case("reasoning-unknown-family", ["eval-reasoning", "--family", "primes"], "family='primes'"),
    Case("state-odd-seq-len", ["eval-state", "--seq_len", "7"], "seq_len=7"),
    Case("check-seq-len-1", ["check", "--seq_len", "1"], "seq_len=1"),
    Case("check-prefix-0", ["check", "--plain_prefix", "0"], "plain_prefix=0"),
    Case("threads-zero", ["generate", "--checkpoint", "x", "--threads", "0"], "threads='0' is invalid"),
    Case("threads-negative", [*TRAIN, "--threads", "-2"], "threads='-2' is invalid"),
    Case("threads-not-a-count", ["compare", "--threads", "1.5"], "threads='1.5' is invalid"),
    Case("threads-word", ["eval-state", "--threads", "all"], "threads='all' is invalid"),
    Case("bench-unknown-section", ["bench", "--sections", "speed"], "sections=('speed',) is invalid"),
    Case("bench-zero-rounds", ["bench", "--rounds", "0"], "rounds=0 is invalid"),
    # --- config files
    Case("config-missing", ["train", "--config", "{c}/nope.toml"], "nope.toml"),
    Case("config-bad-toml", ["train", "--config", "{c}/bad.toml"], "bad.toml", setup="bad_toml"),
    Case("config-bad-yaml", ["train", "--config", "{c}/bad.yaml"], "bad.yaml", setup="bad_yaml", needs=("yaml",)),
    Case("config-unknown-key", ["train", "--config", "{c}/unknown.toml"], "d_modle", setup="unknown_key_toml"),
    Case("config-wrong-type", ["train", "--config", "{c}/wrong.toml"], "n_layers", setup="wrong_type_toml"),
    Case("config-not-a-table", ["train", "--config", "{c}/list.yaml"], "list.yaml", setup="list_yaml",
         needs=("yaml",)),
    # --- data files
    Case("data-missing", [*TRAIN, "--data.source", "{c}/nope.txt"], "nope.txt"),
    Case("data-empty-dir", [*TRAIN, "--data.source", "{c}/empty"], "empty", setup="empty_dir"),
    Case("sft-bad-json", [*TRAIN, "--data.format", "sft", "--data.source", "{c}/bad.jsonl"], "bad.jsonl",
         setup="sft_bad_json"),
    Case("sft-no-fields", [*TRAIN, "--data.format", "sft", "--data.source", "{c}/fields.jsonl"], "fields.jsonl",
         setup="sft_no_fields"),
    Case("sft-empty", [*TRAIN, "--data.format", "sft", "--data.source", "{c}/empty.jsonl"], "empty.jsonl",
         setup="sft_empty"),
    # --- tokenizer files
    Case("tokenizer-bad-json", GEN, "tokenizer_config.json", setup="tokenizer_bad_json"),
    Case("tokenizer-unknown-type", GEN, "unknown tokenizer type 'sentencepiece'", setup="tokenizer_unknown_type"),
    Case("tokenizer-bpe-missing", GEN, "tokenizer.json", setup="tokenizer_bpe_missing"),
    Case("tokenizer-bpe-corrupt", GEN, "tokenizer.json", setup="tokenizer_bpe_corrupt", needs=("tokenizers",)),
    # --- prompts and token ids
    Case("prompt-not-ids", ["generate", "--checkpoint", "{c}/ckpt", "--prompt", "hello"], "token ids",
         setup="no_tokenizer"),
    Case("token-id-out-of-range", ["generate", "--checkpoint", "{c}/ckpt", "--prompt", "1 2 99999"],
         "token id 99999", setup="no_tokenizer"),
    Case("negative-token-id", ["generate", "--checkpoint", "{c}/ckpt", "--prompt", "3,-5"], "token id -5",
         setup="no_tokenizer"),
    Case("empty-prompt", ["generate", "--checkpoint", "{c}/ckpt", "--prompt", ""], "--prompt is empty",
         setup="native"),
    Case("too-many-new-tokens", [*GEN, "--max_new_tokens", "500"], "max_new_tokens=500 is more than the model's "
         "context", setup="native"),
    # --- speculative decoding: a draft length below 1, a drafter with another vocabulary, too deep an early exit
    Case("speculative-gamma-0", ["generate", "--checkpoint", "x", "--drafter", "standard", "--gamma", "0"], "gamma=0"),
    Case("drafter-other-vocab", [*GEN, "--drafter", "{c}/drafter"], "drafter's vocab_size=100",
         setup="drafter_other_vocab"),
    Case("drafter-exit-too-deep", [*GEN, "--drafter", "early_exit:9"], "early_exit:9", setup="native"),
    Case("drafter-missing", [*GEN, "--drafter", "{c}/nope"], "nope", setup="native"),
    # --- checkpoints
    Case("checkpoint-missing", ["generate", "--checkpoint", "{c}/nope", "--prompt", "1"], "does not exist"),
    Case("checkpoint-is-a-file", ["generate", "--checkpoint", "{c}/a-file", "--prompt", "1"], "is a file",
         setup="a_file"),
    Case("checkpoint-empty-dir", ["generate", "--checkpoint", "{c}/empty", "--prompt", "1"], "config.json",
         setup="empty_dir"),
    Case("weights-missing", GEN, "model.safetensors", setup="weights_missing"),
    Case("weights-truncated", GEN, "corrupted or truncated", setup="weights_truncated"),
    Case("weights-wrong-dtype", GEN, "non-floating-point weights", setup="weights_int"),
    Case("weights-wrong-shape", GEN, "shape mismatches", setup="weights_wrong_shape"),
    Case("weights-missing-tensor", GEN, "missing tensors", setup="weights_missing_tensor"),
    Case("config-mismatched", GEN, "does not match", setup="config_mismatched"),
    Case("config-json-corrupt", GEN, "config.json", setup="config_corrupt"),
    Case("config-json-invalid-value", GEN, "n_heads=0", setup="config_invalid_value"),
    Case("eval-checkpoint-missing", ["eval", "--checkpoint", "{c}/nope", "--tasks", "t"], "checkpoint="),
    Case("init-from-missing", [*TRAIN, "--init_from", "{c}/nope"], "nope"),
    Case("init-from-truncated", [*TRAIN, "--init_from", "{c}/ckpt"], "corrupted or truncated",
         setup="weights_truncated"),
    Case("transformers-dir-without-hf", ["generate", "--checkpoint", "{w}/gpt2", "--prompt", "1"], "hf:",
         needs=("transformers",)),
    Case("hf-path-missing", ["generate", "--checkpoint", "hf:{c}/nope", "--prompt", "1"], "not a directory"),
    Case("hf-path-not-a-model", ["generate", "--checkpoint", "hf:{c}/empty", "--prompt", "1"],
         "AutoModelForCausalLM", setup="empty_dir", needs=("transformers",)),
    Case("retrofit-fusion-missing", GEN, "fusion.safetensors", setup="retrofit_fusion_missing",
         needs=("transformers",)),
    Case("retrofit-json-corrupt", GEN, "retrofit", setup="retrofit_json_corrupt", needs=("transformers",)),
]


# ----------------------------------------------------------------------------------------------- case set-ups


def native(world: Path, case: Path) -> None:
    shutil.copytree(world / "ckpt", case / "ckpt")


def no_tokenizer(world: Path, case: Path) -> None:
    native(world, case)
    for name in ("tokenizer_config.json", "tokenizer.json"):
        (case / "ckpt" / name).unlink()


def a_text(world: Path, case: Path) -> None:
    (case / "text.txt").write_text("To be, or not to be, that is the question.\n" * 40)


def a_file(world: Path, case: Path) -> None:
    (case / "a-file").write_text("not a directory\n")


def empty_dir(world: Path, case: Path) -> None:
    (case / "empty").mkdir()


def bad_toml(world: Path, case: Path) -> None:
    (case / "bad.toml").write_text("[model\nd_model = 32\n")


def bad_yaml(world: Path, case: Path) -> None:
    (case / "bad.yaml").write_text("model: [d_model: 32\n")


def unknown_key_toml(world: Path, case: Path) -> None:
    (case / "unknown.toml").write_text("[model]\nd_modle = 32\n")


def wrong_type_toml(world: Path, case: Path) -> None:
    (case / "wrong.toml").write_text('[model]\nn_layers = "four"\n')


def list_yaml(world: Path, case: Path) -> None:
    (case / "list.yaml").write_text("- a\n- b\n")


def sft_bad_json(world: Path, case: Path) -> None:
    (case / "bad.jsonl").write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n')


def sft_no_fields(world: Path, case: Path) -> None:
    (case / "fields.jsonl").write_text('{"question": "a", "answer": "b"}\n')


def sft_empty(world: Path, case: Path) -> None:
    (case / "empty.jsonl").write_text("")


def drafter_other_vocab(world: Path, case: Path) -> None:
    native(world, case)
    make_model(vocab_size=100, feedback=False, dtype=torch.float32).save_pretrained(case / "drafter")


def tokenizer_bad_json(world: Path, case: Path) -> None:
    native(world, case)
    (case / "ckpt" / "tokenizer_config.json").write_text("{not json")


def tokenizer_unknown_type(world: Path, case: Path) -> None:
    native(world, case)
    (case / "ckpt" / "tokenizer_config.json").write_text('{"type": "sentencepiece"}')


def tokenizer_bpe_missing(world: Path, case: Path) -> None:
    native(world, case)
    (case / "ckpt" / "tokenizer_config.json").write_text('{"type": "bpe", "eos_token": "<|endoftext|>"}')
    (case / "ckpt" / "tokenizer.json").unlink()


def tokenizer_bpe_corrupt(world: Path, case: Path) -> None:
    native(world, case)
    (case / "ckpt" / "tokenizer_config.json").write_text('{"type": "bpe", "eos_token": "<|endoftext|>"}')
    (case / "ckpt" / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"')


def weights_missing(world: Path, case: Path) -> None:
    native(world, case)
    (case / "ckpt" / "model.safetensors").unlink()


def weights_truncated(world: Path, case: Path) -> None:
    native(world, case)
    path = case / "ckpt" / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewrite_weights(case: Path, change) -> None:
    path = case / "ckpt" / "model.safetensors"
    state = load_file(str(path))
    change(state)
    save_file(state, str(path))


def weights_int(world: Path, case: Path) -> None:
    native(world, case)
    _rewrite_weights(case, lambda s: s.update({k: v.to(torch.int64) for k, v in s.items()}))


def weights_wrong_shape(world: Path, case: Path) -> None:
    native(world, case)
    _rewrite_weights(case, lambda s: s.update({"embed.weight": torch.zeros(10, 7)}))


def weights_missing_tensor(world: Path, case: Path) -> None:
    native(world, case)
    _rewrite_weights(case, lambda s: s.pop("norm.weight"))


def _edit_config(case: Path, change) -> None:
    path = case / "ckpt" / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def config_mismatched(world: Path, case: Path) -> None:
    native(world, case)
    _edit_config(case, lambda c: c.update(d_model=64))


def config_corrupt(world: Path, case: Path) -> None:
    native(world, case)
    (case / "ckpt" / "config.json").write_text('{"vocab_size": 320, "d_model":')


def config_invalid_value(world: Path, case: Path) -> None:
    native(world, case)
    _edit_config(case, lambda c: c.update(n_heads=0))


def retrofit_fusion_missing(world: Path, case: Path) -> None:
    shutil.copytree(world / "retrofitted", case / "ckpt")
    (case / "ckpt" / "fusion.safetensors").unlink()


def retrofit_json_corrupt(world: Path, case: Path) -> None:
    shutil.copytree(world / "retrofitted", case / "ckpt")
    (case / "ckpt" / "retrofit.json").write_text("{")


# ----------------------------------------------------------------------------------------------- running them


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: (mtime_ns, sha256)."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def changed(before: dict, after: dict) -> list[str]:
    return sorted(name for name, stamp in before.items() if after.get(name) != stamp)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world")
    model = make_model(vocab_size=320, max_seq_len=128, dtype=torch.float32)
    model.save_pretrained(root / "ckpt")
    ByteTokenizer().save(root / "ckpt")
    if _installed("transformers"):
        from conftest import save_tiny_gpt2

        from fullband.integrations.retrofit import retrofit

        retrofit(save_tiny_gpt2(root / "gpt2")).save_pretrained(root / "retrofitted")
        ByteTokenizer().save(root / "retrofitted")
    return root


# Runs ``fullband.cli.main(argv)`` in a forked child per job, each with its own cwd and stderr, a few at a time, in
# one process that imported torch, transformers and fullband's commands once: each case then costs its own work,
# not an import (about 2 s each on a small CPU). The child is the CLI exactly as the console script runs it; an
# exception that escapes it prints its traceback to the child's stderr, which the test looks for.
RUNNER = r"""
import json, os, sys, traceback
import torch, safetensors
try:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers.modeling_utils, transformers.models.auto.modeling_auto, transformers.models.gpt2.modeling_gpt2
except ImportError:
    pass
# ... and every module the commands import lazily (transformers' models alone pull in accelerate, scipy and PIL),
# once here rather than once in every forked child: this took the fixture from about 75 s to under 30 s
import fullband.cli, fullband.families.loading, fullband.data, fullband.devices, fullband.training.run
import fullband.generation.speculative, fullband.generation.drafters
for name in ("fullband.experiments.compare.study", "fullband.experiments.recipe.study",
             "fullband.experiments.reasoning.study", "fullband.experiments.state_tracking.study", "fullband.selfcheck",
             "fullband.bench.run", "fullband.evaluation.run", "fullband.data.prepare",
             "fullband.integrations.retrofit"):
    try:
        __import__(name)
    except ImportError:  # an optional extra not installed: its cases are skipped anyway
        pass
jobs, parallel = json.load(open(sys.argv[1])), int(sys.argv[2])
running, codes = {}, {}

def child(job):
    os.chdir(job["cwd"])
    err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    out = os.open(os.devnull, os.O_WRONLY)
    os.dup2(err, 2)
    os.dup2(out, 1)
    sys.argv = ["fullband", *job["argv"]]
    try:
        from fullband.cli import main
        code = main(job["argv"])
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

for i, job in enumerate(jobs):
    while len(running) >= parallel:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    pid = os.fork()
    if pid == 0:
        child(job)
    running[pid] = i
while running:
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps([codes[i] for i in range(len(jobs))]))
"""


@pytest.fixture(scope="module")
def results(world, tmp_path_factory) -> dict[str, dict]:
    cases_root = tmp_path_factory.mktemp("cases")
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FULLBAND_CACHE_DIR": str(home / "fullband"),
           "FULLBAND_OFFLINE": "1", "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("FULLBAND_TRACEBACK", None)
    runnable = [c for c in CASES if all(_installed(m) for m in c.needs)]
    jobs, before = [], {}
    for case in runnable:
        directory = cases_root / case.name
        directory.mkdir()
        if case.setup:
            globals()[case.setup](world, directory)
        argv = [a.replace("{w}", str(world)).replace("{c}", str(directory)) for a in case.argv]
        before[case.name] = snapshot(directory)
        jobs.append({"argv": argv, "cwd": str(directory), "stderr": str(home / f"{case.name}.stderr")})
    shared_before = snapshot(world)
    (home / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(home / "jobs.json"), "2"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.splitlines()[-1])
    shared_changed = [f"(shared) {name}" for name in changed(shared_before, snapshot(world))]
    return {
        case.name: {"rc": code, "stderr": Path(job["stderr"]).read_text(),
                    "changed": changed(before[case.name], snapshot(cases_root / case.name)) + shared_changed}
        for case, job, code in zip(runnable, jobs, codes, strict=True)
    }


def test_a_bad_option_is_answered_before_torch_is_imported():
    code = ("import sys; from fullband.cli import main; "
            "rc = main(['generate', '--checkpoint', 'x', '--decode.mode', 'fast']);"
            "assert rc == 2 and 'torch' not in sys.modules, sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == ("fullband generate: error: decode.mode='fast' is invalid: must be one of "
                                   "standard, soft, fused:K, exact")


def test_the_console_script_answers_an_unavailable_gpu_in_one_line(world, tmp_path):
    """The issue's example, through the installed ``fullband`` script in a fresh interpreter."""
    script = Path(sys.executable).with_name("fullband")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fullband.cli"]
    device = "cuda:7" if not torch.cuda.is_available() or torch.cuda.device_count() <= 7 else "cuda:99"
    proc = subprocess.run([*command, "generate", "--checkpoint", str(world / "ckpt"), "--prompt", "hi", "--device",
                           device], capture_output=True, text=True, timeout=120, env={**os.environ,
                                                                                      "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and f"device='{device}' is invalid" in proc.stderr, proc.stderr


def test_there_are_at_least_50_distinct_cases():
    assert len({c.name for c in CASES}) == len(CASES) >= 50
    assert len({(*c.argv, c.setup) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_one_clear_line(case, results):
    if case.name not in results:
        pytest.skip(f"needs {', '.join(case.needs)}")
    result = results[case.name]
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    assert result["rc"] != 0, result
    assert "Traceback" not in result["stderr"], result["stderr"]
    assert len(lines) == 1, result["stderr"]
    assert lines[0].startswith("fullband") and ": error: " in lines[0], lines[0]
    assert case.says in lines[0], lines[0]
    assert result["changed"] == [], f"files changed: {result['changed']}"
