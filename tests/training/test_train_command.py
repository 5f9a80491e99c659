"""``fullband train`` end to end on the embedded corpus: run, outputs, resume, SFT, init_from, errors."""

import json
import re
import shutil

import pytest
import torch

from fullband import FullBandwidthLM
from fullband.cli import main
from fullband.configio import build_config, load_config_file
from fullband.data import ByteTokenizer
from fullband.generation import generate
from fullband.training.config import TrainRunConfig
from fullband.training.run import build_batches, build_model, build_tokenizer
from fullband.training.validation import loss_eval

TINY = ["--model.d_model", "32", "--model.n_layers", "2", "--model.n_heads", "2", "--train.batch_size", "2",
        "--train.seq_len", "32", "--train.eval_batches", "2", "--optim.warmup_steps", "2", "--optim.lr", "3e-3"]


def train(out_dir, *extra) -> int:
    return main(["train", "--out_dir", str(out_dir), *TINY, *extra])


def records(out_dir, kind="train"):
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_train_on_shakespeare_writes_a_usable_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--train.max_steps", "8", "--train.eval_every", "4", "--train.log_every", "1") == 0
    printed = capsys.readouterr().out
    assert "trained 8 steps" in printed and "val_bpb_1pass" in printed
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.toml", "metrics.jsonl", "model",
                                                     "tensorboard", "tokenizer"]  # tensorboard: a dev extra
    train_records = records(out)
    assert [r["step"] for r in train_records] == list(range(8))
    # The default (the recipe) runs multi-pass batches from the first step, with NorMuon on the matrices.
    assert all(r["passes"] >= 2 for r in train_records)
    assert json.loads((out / "checkpoints" / "step-0000008" / "run_config.json").read_text())["preset"] == "recipe"
    assert train_records[-1]["token_equiv_compute"] > train_records[-1]["tokens"]
    evals = records(out, "eval")
    assert [e["step"] for e in evals] == [3, 7]
    assert {"val_loss_1pass", "val_loss_2pass", "val_loss_3pass", "val_bpb_1pass"} <= set(evals[-1])
    model = FullBandwidthLM.from_pretrained(out / "model")
    assert model.config.vocab_size == 320  # 257 byte tokens rounded up to a multiple of 64
    card = (out / "model" / "README.md").read_text()  # the model card records what the run trained on
    assert "512 tokens" in card and "in 8 steps on `shakespeare`" in card
    assert main(["generate", "--checkpoint", str(out / "model"), "--prompt", "KING:", "--max_new_tokens", "5"]) == 0
    tok = ByteTokenizer()
    new = generate(model, tok.encode("KING:"), 5, mode="soft", stop_token_ids=[tok.eos_id])[len("KING:") :]
    assert capsys.readouterr().out == "KING:" + tok.decode([t for t in new if t != tok.eos_id]) + "\n"


def test_train_and_generate_a_model_without_positional_encoding(tmp_path, capsys):
    # --model.position_encoding none reaches the model (NoPE), its checkpoint and the run's settings, and the
    # checkpoint decodes through the CLI as generate() decodes the loaded model.
    out = tmp_path / "run"
    assert train(out, "--train.max_steps", "2", "--train.eval_every", "0", "--model.position_encoding", "none") == 0
    assert json.loads((out / "model" / "config.json").read_text())["position_encoding"] == "none"
    assert load_config_file(out / "config.toml")["model"]["position_encoding"] == "none"
    model = FullBandwidthLM.from_pretrained(out / "model")
    assert model.config.position_encoding == "none"
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out / "model"), "--prompt", "KING:", "--max_new_tokens", "5"]) == 0
    tok = ByteTokenizer()
    new = generate(model, tok.encode("KING:"), 5, mode="soft", stop_token_ids=[tok.eos_id])[len("KING:") :]
    assert capsys.readouterr().out == "KING:" + tok.decode([t for t in new if t != tok.eos_id]) + "\n"


def test_an_unknown_position_encoding_is_one_line_naming_the_choices(tmp_path, capsys):
    assert train(tmp_path / "run", "--train.max_steps", "1", "--model.position_encoding", "alibi") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "position_encoding='alibi' is invalid: must be one of ('rope', 'none')" in err
    assert not (tmp_path / "run" / "model").exists()


def test_the_printed_loss_is_val_loss_1pass_on_the_training_batch(tmp_path, capsys):
    """What the final line (and the progress bar) calls the loss is the next-token loss of pass 1 by val_loss_1pass's
    definition (training.validation.loss_eval), on the step's batch; the objective, about twice it with feedback on,
    is printed under its own name."""
    out = tmp_path / "run"
    assert train(out, "--train.max_steps", "1", "--train.eval_every", "0") == 0
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if line.startswith("last step's next-token loss"))
    numbers = re.findall(r"\d+\.\d{4}", line)
    shown_pass1, shown_objective = float(numbers[0]), float(numbers[-1])
    # Step 0 trains the initial weights on batch 0: rebuild both as the run did and measure.
    cfg = build_config(TrainRunConfig, load_config_file(out / "config.toml"), {})
    tokenizer = build_tokenizer(cfg, None, True, lambda value: value)
    model = build_model(cfg, tokenizer, torch.device("cpu"))
    batch = build_batches(cfg, tokenizer, 1).batch_fn
    with torch.no_grad():
        expected = loss_eval(lambda index, rank, world: batch(0, rank, world), 1, (1,))(model, 0)["val_loss_1pass"]
    assert shown_pass1 == pytest.approx(expected, abs=5e-5)
    record = records(out)[0]
    assert record["pass_losses"][0] == pytest.approx(expected, abs=1e-6)
    assert shown_objective == pytest.approx(record["objective"], abs=5e-5) and shown_objective > 1.5 * shown_pass1


def test_resumed_run_reproduces_the_uninterrupted_metrics(tmp_path):
    out = tmp_path / "run"
    args = ["--train.max_steps", "6", "--train.checkpoint_every", "3", "--train.log_every", "1"]
    assert train(out, *args) == 0
    uninterrupted = records(out)
    # Interrupted after step 3: the last checkpoint is gone and the log holds a partial extra line.
    shutil.rmtree(out / "checkpoints" / "step-0000006")
    with open(out / "metrics.jsonl", "a") as log:
        log.write('{"kind": "train", "step": 4, "objective": 123')
    assert train(out, *args, "--resume", "true") == 0
    resumed = records(out)
    assert [r["objective"] for r in resumed] == [r["objective"] for r in uninterrupted]
    assert [r["pass_losses"] for r in resumed] == [r["pass_losses"] for r in uninterrupted]


def test_fine_tune_sft_from_a_baseline_with_three_passes(tmp_path):
    base = tmp_path / "base"
    assert train(base, "--train.max_steps", "2", "--model.feedback", "false") == 0
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"Q{i}: 2+{i}=", "completion": f" {2 + i}"} for i in range(20)]
    rows.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "sft"
    assert main(["train", "--out_dir", str(out), "--init_from", str(base / "model"), "--data.format", "sft",
                 "--data.source", str(data), "--schedule.feedback_start", "0", "--schedule.pass_mix", "0,1",
                 "--train.max_steps", "3", "--train.batch_size", "4", "--train.seq_len", "32",
                 "--train.log_every", "1"]) == 0
    assert [r["passes"] for r in records(out)] == [3, 3, 3]
    tuned = FullBandwidthLM.from_pretrained(out / "model")
    assert tuned.fusion is not None and tuned.config.d_model == 32

    # The prompt is kept out of the loss all the way through the CLI and the Trainer: with one example, every
    # row of the first batch is that example, and pass 1 (plain, so the new fusion plays no part) of step 0 must
    # score exactly the completion and end-of-text tokens under the initial (baseline) weights.
    prompt, completion = "Q: 2+3=", " 5"
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
    assert main(["train", "--out_dir", str(tmp_path / "one"), "--init_from", str(base / "model"), "--data.format",
                 "sft", "--data.source", str(one), "--schedule.feedback_start", "0", "--schedule.pass_mix", "0,1",
                 "--train.max_steps", "1", "--train.batch_size", "2", "--train.seq_len", "32"]) == 0
    ids = [*prompt.encode(), *completion.encode(), ByteTokenizer.eos_id]
    with torch.no_grad():
        logits = FullBandwidthLM.from_pretrained(base / "model")(torch.tensor([ids[:-1]])).logits[0]
    logprobs = torch.log_softmax(logits.double(), -1)
    trained = range(len(prompt), len(ids))  # the targets: completion tokens and end-of-text
    expected = -sum(float(logprobs[t - 1, ids[t]]) for t in trained) / len(trained)
    assert records(tmp_path / "one")[0]["pass_losses"][0] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--train.seq_len", "2000"], "train.seq_len=2000 is invalid: must be at most the model's max_seq_len=1024"),
        (["--data.source", "nowhere.txt"], "corpus not found"),
        (["--model.vocab_size", "100"], "the tokenizer has 257 tokens"),
        (["--data.tokenizer", "sentencepiece"], "data.tokenizer='sentencepiece' is invalid: must be one of"),
    ],
)
def test_bad_runs_fail_with_a_message(tmp_path, capsys, extra, message):
    assert train(tmp_path / "run", "--train.max_steps", "1", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unknown_option_is_rejected_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train(tmp_path / "run", "--train.lr", "1")
    assert "unrecognized arguments: --train.lr" in capsys.readouterr().err


def test_init_from_rejects_a_tokenizer_larger_than_the_model_vocabulary(tmp_path, capsys):
    base = tmp_path / "base"
    assert train(base, "--train.max_steps", "1", "--model.vocab_size", "257") == 0
    for name in ("tokenizer_config.json", "tokenizer.json"):  # no tokenizer of its own: a new BPE one is trained
        (base / "model" / name).unlink()
    assert train(tmp_path / "bpe", "--init_from", str(base / "model"), "--data.tokenizer", "bpe",
                 "--data.bpe_vocab_size", "300", "--train.max_steps", "1") == 2
    assert "has vocab_size=257 but the tokenizer has 300 tokens" in capsys.readouterr().err


def test_unwritable_output_directory_is_reported(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert train(blocker / "run", "--train.max_steps", "1") == 2
    err = capsys.readouterr().err
    assert "is not writable" in err and "pick another --out_dir" in err
