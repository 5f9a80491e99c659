"""A new user's session, run as they would: the installed command in subprocesses (in this process where only the
exit status and the printed lines matter), on their own text, a tiny model. A run is never lost: a rerun without
--resume is refused and changes nothing, --resume true alone continues with the run's own settings to the
uninterrupted run's weights, a conflicting flag is one short line, and Ctrl-C saves a checkpoint and prints the
command that continues it, which works as printed. No dead ends (issue 55): every refusal changes nothing and names
the command that works (a resume whose length cannot apply, a run whose only checkpoint is corrupt, a failed
prepare), a warning is one line, metrics say what they hold, a directory holds out the share asked for, and the
help, the files' modes and the suggested commands are what a user expects."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from fullband.cli import commands, main
from fullband.config import duration, plural

FULLBAND = Path(sys.executable).parent / "fullband"  # the console script pip installed with the package
TINY = ["--model.d_model", "32", "--model.n_layers", "1", "--model.n_heads", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.eval_every", "0", "--train.compile", "false", "--train.log_every", "1",
        "--threads", "1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The user's own text file (a few thousand lines)."""
    path = tmp_path_factory.mktemp("data") / "notes.txt"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    path.write_text("".join(f"{words[i % 8]} {words[(i * 3) % 8]} {i % 97}\n" for i in range(3000)))
    return path


def fullband(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FULLBAND), *args], capture_output=True, text=True, timeout=300, env=ENV)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def test_a_run_is_never_lost_and_resume_is_one_flag(tmp_path, corpus):
    run = tmp_path / "R"
    first = fullband("train", "--out_dir", str(run), *TINY, "--data.source", str(corpus), "--train.max_steps", "8",
                     "--train.checkpoint_every", "4")
    assert first.returncode == 0, first.stderr
    # What it says before step 1: parameters, device, threads, the data's tokens.
    assert "parameters" in first.stdout and "device: cpu, 1 thread\n" in first.stdout
    assert "training tokens" in first.stdout
    uninterrupted = load_file(run / "model" / "model.safetensors")
    saved = {name: (run / name).read_bytes() for name in ("config.toml", "metrics.jsonl")}

    # Forgetting --resume (and giving other settings): refused in one line; the run's files are untouched.
    again = fullband("train", "--out_dir", str(run), "--model.d_model", "256", "--data.source", "shakespeare")
    assert "already holds checkpoints" in one_line(again) and "--resume true" in one_line(again)
    assert {name: (run / name).read_bytes() for name in saved} == saved

    # Killed after step 4's checkpoint: --resume true alone continues with the run's own settings (its d_model, its
    # file, its steps) and ends where the uninterrupted run ended, bit for bit.
    (run / "checkpoints" / "step-0000008" / "manifest.json").unlink()
    resumed = fullband("train", "--out_dir", str(run), "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "config.toml").read_bytes() == saved["config.toml"]
    assert steps(run) == list(range(8))
    weights = load_file(run / "model" / "model.safetensors")
    assert weights.keys() == uninterrupted.keys()
    assert all((weights[k] == uninterrupted[k]).all() for k in weights)

    # A setting the run cannot change: one short line naming it and both values.
    conflict = one_line(fullband("train", "--out_dir", str(run), "--resume", "true", "--model.d_model", "999"))
    assert "model.d_model=999" in conflict and "model.d_model=32" in conflict and len(conflict) < 200, conflict


def test_ctrl_c_saves_a_checkpoint_and_the_printed_command_resumes_it(tmp_path, corpus):
    run = tmp_path / "S"
    args = [*TINY, "--data.source", str(corpus), "--train.max_steps", "200", "--train.checkpoint_every", "1000"]
    process = subprocess.Popen([str(FULLBAND), "train", "--out_dir", str(run), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=ENV)
    log, deadline = run / "metrics.jsonl", time.monotonic() + 120
    while not (log.is_file() and len(log.read_text().splitlines()) >= 5):  # a few steps in
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    lines = out.splitlines()
    command = lines[lines.index(next(line for line in lines if line.startswith("interrupted: "))) + 1].strip()
    interrupted_at = len(steps(run))
    assert 5 <= interrupted_at < 200 and (run / "checkpoints" / f"step-{interrupted_at:07d}").is_dir()
    argv = shlex.split(command)
    assert argv[:2] == ["fullband", "train"], command
    resumed = subprocess.run([str(FULLBAND), *argv[1:]], capture_output=True, text=True, timeout=300, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert steps(run) == list(range(200))
    # The same weights as the run without the interruption.
    whole = tmp_path / "whole"
    assert fullband("train", "--out_dir", str(whole), *args).returncode == 0
    expected, got = (load_file(d / "model" / "model.safetensors") for d in (whole, run))
    assert all((got[k] == expected[k]).all() for k in expected)


# ---------------------------------------------------------------------------------------------- no dead ends (55)


def cli(*args: str) -> tuple[int, str, str]:
    """``fullband ARGS`` in this process: (exit status, stdout, stderr); --help's exit is its status."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exit_:
            status = exit_.code or 0
    return status, out.getvalue(), err.getvalue()


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path, with its bytes."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def messages(result: subprocess.CompletedProcess) -> list[str]:
    """stderr's lines, the progress bar's left out."""
    return [line for line in re.split(r"[\r\n]+", result.stderr) if line.strip() and "%|" not in line]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> tuple[Path, subprocess.CompletedProcess]:
    """A finished 6-step run (checkpoints at 3 and 6) and what `fullband train` printed."""
    run = tmp_path_factory.mktemp("trained") / "R"
    result = fullband("train", "--out_dir", str(run), *TINY, "--data.source", str(corpus), "--train.max_steps", "6",
                      "--train.checkpoint_every", "3")
    assert result.returncode == 0, result.stderr
    return run, result


def test_a_resume_whose_length_cannot_apply_is_refused_and_changes_nothing(trained):
    """Issue 55.1: --train.max_steps below the run's step exited 0 ("trained 6 steps") and rewrote config.toml and
    model/; now one line, and every file of the run byte for byte as it was."""
    run, _ = trained
    before = snapshot(run)
    line = one_line(fullband("train", "--out_dir", str(run), "--resume", "true", "--train.max_steps", "3"))
    assert "train.max_steps=3" in line and "step 6" in line and "--train.max_steps 6 or more" in line, line
    assert snapshot(run) == before


def test_a_run_whose_only_checkpoint_is_corrupt_starts_again_with_resume_auto(tmp_path, corpus):
    """Issue 55.2 (and 55.6): --resume true said use --resume auto, which refused the directory. Now every refusal
    names `--resume auto`, which sets the corrupt checkpoint aside (kept, and says where in one warning line) and
    trains the run again from step 0, to the weights it had."""
    run = tmp_path / "C"
    assert fullband("train", "--out_dir", str(run), *TINY, "--data.source", str(corpus), "--train.max_steps",
                    "4").returncode == 0
    weights = (run / "model" / "model.safetensors").read_bytes()
    only = run / "checkpoints" / "step-0000004"
    damaged = bytearray((only / "model.safetensors").read_bytes())
    damaged[-1] ^= 0xFF
    (only / "model.safetensors").write_bytes(bytes(damaged))
    before = snapshot(run)
    for resume in ([], ["--resume", "true"]):  # a new run there, and a resume: the same way out
        line = one_line(fullband("train", "--out_dir", str(run), *resume))
        assert f"`fullband train --out_dir {run} --resume auto`" in line, line
        assert snapshot(run) == before
    command = shlex.split(re.search(r"`(fullband [^`]*)`", line).group(1))
    again = subprocess.run([str(FULLBAND), *command[1:]], capture_output=True, text=True, timeout=300, env=ENV)
    assert again.returncode == 0, again.stderr
    aside = run / "checkpoints" / "step-0000004.corrupt"
    warned = messages(again)
    assert len(warned) == 1 and warned[0].startswith("fullband train: warning: ") and str(aside) in warned[0], warned
    assert snapshot(aside) == {name.removeprefix("checkpoints/step-0000004/"): data for name, data in before.items()
                               if name.startswith("checkpoints/step-0000004/")}
    assert steps(run) == list(range(4))
    assert (run / "model" / "model.safetensors").read_bytes() == weights


def test_warnings_are_one_line_naming_the_command(tmp_path, corpus):
    """Issue 55.6: a warning from a command is `fullband CMD: warning: ...`, no Python file:line or source line."""
    run = tmp_path / "W"
    args = [*TINY, "--data.source", str(corpus), "--train.checkpoint_every", "2"]
    assert fullband("train", "--out_dir", str(run), *args, "--train.max_steps", "4").returncode == 0
    (run / "checkpoints" / "step-0000004" / "rng.pt").write_bytes(b"torn")  # a partial copy: the run falls back
    longer = fullband("train", "--out_dir", str(run), "--resume", "true", "--train.max_steps", "6")
    assert longer.returncode == 0, longer.stderr
    lines = messages(longer)
    assert len(lines) == 2 and all(line.startswith("fullband train: warning: ") for line in lines), lines
    assert "skipping partial or corrupt checkpoint" in lines[0] and "feedback schedule changed" in lines[1]
    assert "UserWarning" not in longer.stderr and "warnings.warn" not in longer.stderr


def test_metrics_name_what_they_hold(trained):
    """Issue 55.7: ntp_loss was the multi-pass objective (about twice the next-token loss); a record's `loss` is now
    pass 1's next-token loss, the number the terminal prints, and `objective` the weighted sum of the passes."""
    run, result = trained
    records = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert any(len(r["pass_losses"]) > 1 for r in records)
    for r in records:
        assert "ntp_loss" not in r and r["loss"] == r["pass_losses"][0]
        later = r["pass_losses"][1:]
        # feedback_weight 1 (the recipe's); the z-loss term (weight 1e-5) is below the tolerance
        assert r["objective"] == pytest.approx(r["loss"] + (sum(later) / len(later) if later else 0.0), abs=1e-3)
    assert f"pass 1 {records[-1]['loss']:.4f}" in result.stdout


def test_a_directory_of_a_few_files_holds_out_the_share_asked_for(tmp_path):
    """Issue 55.8: 6 files at the default 0.05 fractions held out 2 whole files (half the text when they were the
    large ones); now 5% of the bytes each, the validation text the same as `fullband prepare` holds out."""
    corpus = tmp_path / "notes"
    corpus.mkdir()
    for i in range(6):  # 1, 2, 4, ... 32 parts: the sizes of a user's few files
        (corpus / f"part{i}.txt").write_text("".join(f"note {i} line {j}\n" for j in range(40 * 2 ** i)))
    total = sum(p.stat().st_size for p in corpus.iterdir())
    status, out, err = cli("train", "--out_dir", str(tmp_path / "run"), *TINY, "--data.source", str(corpus),
                           "--train.max_steps", "1", "--train.checkpoint_every", "0")
    assert status == 0, err
    trained, validation = (int(n.replace(",", "")) for n in
                           re.search(r"([\d,]+) training tokens, ([\d,]+) validation tokens", out).groups())
    # byte tokenizer: a token per byte, and an end-of-text token between documents
    assert 0.05 * total <= validation <= 0.05 * total + 20 and trained >= 0.89 * total
    status, out, err = cli("prepare", "--input", str(corpus), "--out_dir", str(tmp_path / "shards"), "--workers", "1",
                           "--progress", "false")
    assert status == 0, err
    prepared = int(re.search(r"validation: ([\d,]+) tokens", out).group(1).replace(",", ""))
    assert abs(prepared - validation) <= 6


@pytest.mark.parametrize("failure", ["not UTF-8", "empty", "no --field"])
def test_a_failed_prepare_leaves_nothing_that_blocks_the_fixed_rerun(tmp_path, failure):
    """Issue 55.3: a failed prepare left progress.json and tokenizer/ behind, and the fixed rerun was refused as "an
    unfinished prepare of other input". Now it leaves nothing, and the fixed command runs."""
    text = "".join(f"line {i} of the user's corpus\n" for i in range(400))
    out = tmp_path / "shards"
    source = tmp_path / ("rows.jsonl" if failure == "no --field" else "corpus.txt")
    command = ["prepare", "--input", str(source), "--out_dir", str(out), "--workers", "1", "--progress", "false"]
    fixed = command
    if failure == "not UTF-8":
        source.write_bytes(text.encode() + "café\n".encode("latin-1"))
    elif failure == "empty":
        source.write_text("")
    else:
        source.write_text("".join(json.dumps({"content": line}) + "\n" for line in text.splitlines()))
        fixed = [*command, "--field", "content"]
    status, _, err = cli(*command)
    assert status == 2 and err.startswith("fullband prepare: error: "), err
    assert not out.exists()
    if failure != "no --field":
        source.write_text(text)
    status, _, err = cli(*fixed)
    assert status == 0, err
    assert (out / "index.json").is_file() and not (out / "progress.json").exists()


def test_every_file_of_a_run_is_written_with_one_mode(trained):
    """Issue 55.9: model.safetensors was 0600 (safetensors' own temporary file) beside 0644 files."""
    run, _ = trained
    modes = {path.relative_to(run).as_posix(): path.stat().st_mode & 0o777 for path in run.rglob("*")
             if path.is_file()}
    assert "model/model.safetensors" in modes and len(set(modes.values())) == 1, modes


def test_the_terminal_says_counts_and_times_as_a_person_would(trained):
    """Issue 55.9: "1 layers", "0.0 min"."""
    _, result = trained
    assert ", 1 layer\n" in result.stdout and "device: cpu, 1 thread\n" in result.stdout
    assert [plural(1, "layer"), plural(4, "layer")] == ["1 layer", "4 layers"]
    assert [duration(2.4), duration(59), duration(125)] == ["2 s", "59 s", "2.1 min"]


def help_of(*args: str) -> str:
    status, out, err = cli(*args)
    assert status == 0, err
    return out


def test_help_shows_the_common_options_first_and_no_empty_defaults():
    """Issue 55.9: `train --help` was ~450 lines; required options showed `(default: )`; eval-controls' help told
    its research history."""
    short = help_of("train", "--help")
    every = help_of("train", "--help-all")
    assert len(short.splitlines()) < 100 < len(every.splitlines())
    assert "fullband train --help-all lists all" in short.splitlines()[-1]
    for option in ("--out_dir", "--resume", "--data.source", "--model.d_model", "--train.max_steps", "--optim.lr"):
        assert option in short and option in every
    assert "--optim.ns_steps" in every and "--optim.ns_steps" not in short
    for command in commands():
        text = help_of(command, "--help")
        assert "(default: )" not in text and "(default: ())" not in text, command
    assert "--checkpoint" in help_of("generate", "--help") == help_of("generate", "--help-all")
    assert not re.search(r"added after|follow-up|showed that", " ".join(help_of("eval-controls", "--help").split()))


def test_the_commands_doc_says_which_studies_take_flat_options():
    """Issue 55.9: docs/commands.md said every study takes sections; the word-problem studies take flat grids."""
    flat = [name for name, command in commands().items() if "learning_rates" in command.config.__dataclass_fields__]
    assert flat
    doc = " ".join((Path(__file__).parents[1] / "docs" / "commands.md").read_text().split())
    sentence = re.search(r"[^.]*take flat options[^.]*", doc).group(0)
    assert all(f"`{name}`" in sentence for name in flat), (flat, sentence)
    for name in flat:  # and they do take the flat options the doc shows
        assert all(flag in help_of(name, "--help") for flag in ("--steps", "--d_model", "--learning_rates"))


def test_the_compare_reports_one_run_command_runs_as_printed(tmp_path, corpus):
    """Issue 55.9: the report suggested `fullband train --config .../config.toml`, refused: the file names the
    directory that already holds that run."""
    from fullband.experiments.compare.config import CompareConfig
    from fullband.experiments.compare.study import FEEDBACK, commands

    out = tmp_path / "cmp"
    cfg = CompareConfig(preset="smoke", out_dir=str(out))
    run = out / f"seed{cfg.train.seed}" / FEEDBACK  # where compare trains its full-bandwidth run, as fullband train
    status, _, err = cli("train", "--out_dir", str(run), *TINY, "--data.source", str(Path(corpus)),
                         "--train.max_steps", "2")
    assert status == 0, err
    argv = shlex.split(commands(cfg, out)["one_run"])
    assert argv[:2] == ["fullband", "train"]
    status, _, err = cli(*argv[1:])
    assert status == 0, err


def test_decoding_a_retrofitted_checkpoint_prints_no_transformers_warning(tmp_path):
    """Issue 55.9: `fullband generate` on a retrofitted checkpoint with its transformers tokenizer printed
    "You are using a model of type `fullband_retrofit` to instantiate a model of type ``": the tokenizer was read
    without the family's model type registered (fullband's "type": "hf" marker hid it)."""
    from conftest import save_tiny_gpt2
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from fullband.data import TransformersTokenizer
    from fullband.integrations.retrofit import retrofit

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["the king and the queen walk to the castle"] * 20, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = TransformersTokenizer(PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>"))
    checkpoint = tmp_path / "retrofitted"
    retrofit(save_tiny_gpt2(tmp_path / "gpt2", vocab_size=320)).save_pretrained(checkpoint)
    tokenizer.save(checkpoint)
    result = fullband("generate", "--checkpoint", str(checkpoint), "--prompt", "the king", "--max_new_tokens", "3")
    assert result.returncode == 0 and result.stdout.startswith("the king"), result.stderr
    assert result.stderr == ""
