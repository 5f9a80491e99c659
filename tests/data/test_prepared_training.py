"""Training on prepared shards and with a pretrained tokenizer: memory-mapped windows, disjoint DDP ranks,
bit-exact resume, the held-out split, and a tokenizer.json that trains and decodes."""

import json
import shutil

import numpy as np
import pytest
import torch

from fullband.cli import main
from fullband.data import TokenBatches, load_prepared, load_pretrained_tokenizer, load_tokenizer
from fullband.data.config import PrepareConfig
from fullband.data.prepare import prepare_shards

TINY = ["--model.d_model", "32", "--model.n_layers", "2", "--model.n_heads", "2", "--train.batch_size", "2",
        "--train.seq_len", "16", "--train.eval_batches", "2", "--optim.warmup_steps", "2", "--optim.lr", "3e-3",
        "--threads", "1"]
TEXT = "".join(f"Line {i}: to be or not to be, that is question number {i}.\n" for i in range(300))


@pytest.fixture
def shards(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    prepare_shards(PrepareConfig(input=str(tmp_path / "corpus.txt"), out_dir=str(tmp_path / "shards"),
                                 chunk_bytes=2000, shard_tokens=3000, val_fraction=0.1, workers=1, progress=False))
    return tmp_path / "shards"


def records(out_dir, kind="train"):
    return [r for r in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_windows_come_from_memory_maps_and_ranks_are_disjoint(shards):
    train = load_prepared(shards, "train")
    assert len(train.tokens) >= 4 and all(isinstance(p, np.memmap) for p in train.tokens)
    batches = TokenBatches(train.tokens, seq_len=16, batch_size=8, seed=3)
    whole = batches.windows(5)
    ranks = [batches.windows(5, rank=r, world_size=2) for r in range(2)]
    assert ranks[0] + ranks[1] == whole and not set(ranks[0]) & set(ranks[1])  # each rank its own rows
    assert all(0 <= s <= len(train.tokens[p]) - 16 for p, s in whole)  # a window never crosses a shard end
    x, _ = batches.batch(5, rank=1, world_size=2)
    assert x.tolist() == [train.tokens[p][s : s + 16].tolist() for p, s in ranks[1]]
    assert torch.equal(batches.batch(5)[0], TokenBatches(train.tokens, 16, 8, seed=3).batch(5)[0])  # f(seed, step)
    assert len({p for step in range(20) for p, _ in batches.windows(step)}) == len(train.tokens)  # all shards used
    # One array and a one-shard list draw the same batches (so TokenBatches' old behaviour is unchanged).
    one = np.asarray(train.tokens[0])
    assert torch.equal(TokenBatches(one, 16, 8, seed=1).batch(2)[0], TokenBatches([one], 16, 8, seed=1).batch(2)[0])


def test_training_on_shards_resumes_bit_for_bit(shards, tmp_path):
    out = tmp_path / "run"
    args = ["--data.source", str(shards), "--out_dir", str(out), *TINY, "--train.max_steps", "6",
            "--train.checkpoint_every", "3", "--train.log_every", "1", "--train.eval_every", "3"]
    assert main(["train", *args]) == 0
    uninterrupted, evals = records(out), records(out, "eval")
    assert "val_bpb_1pass" in evals[-1]  # the held-out split from the index, with its byte count
    shutil.rmtree(out / "checkpoints" / "step-0000006")
    assert main(["train", *args, "--resume", "true"]) == 0
    assert [r["objective"] for r in records(out)] == [r["objective"] for r in uninterrupted]
    assert records(out, "eval")[-1] == evals[-1]
    assert load_tokenizer(out / "model").fingerprint == load_tokenizer(shards / "tokenizer").fingerprint


def save_word_tokenizer(path):
    """A tiny BPE tokenizer.json whose end-of-text token is </s> (not fullband's own)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([TEXT], trainer=trainer)
    tk.save(str(path))
    return tk


def test_a_pretrained_tokenizer_trains_and_generate_decodes_with_it(tmp_path, capsys):
    tk = save_word_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "corpus.txt").write_text(TEXT)
    out = tmp_path / "run"
    assert main(["train", "--data.source", str(tmp_path / "corpus.txt"), "--data.tokenizer",
                 f"hf:{tmp_path / 'tokenizer.json'}", "--out_dir", str(out), *TINY, "--train.max_steps", "3"]) == 0
    saved = load_tokenizer(out / "model")
    assert saved.eos_id == tk.token_to_id("</s>") and saved.vocab_size == tk.get_vocab_size()
    assert saved.fingerprint == load_pretrained_tokenizer(tmp_path / "tokenizer.json").fingerprint
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out / "model"), "--prompt", "Line 7:", "--max_new_tokens", "6",
                 "--threads", "1", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Line 7:") and len(printed) > len("Line 7:\n")  # text, not token ids

    # The same tokenizer through prepare: the shards bring it, and naming another one is refused.
    assert main(["prepare", "--input", str(tmp_path / "corpus.txt"), "--out_dir", str(tmp_path / "shards"),
                 "--tokenizer", f"hf:{tmp_path / 'tokenizer.json'}", "--progress", "false", "--workers", "1"]) == 0
    assert main(["train", "--data.source", str(tmp_path / "shards"), "--out_dir", str(tmp_path / "run2"), *TINY,
                 "--train.max_steps", "2"]) == 0
    assert load_tokenizer(tmp_path / "run2" / "model").fingerprint == saved.fingerprint
    assert main(["train", "--data.source", str(tmp_path / "shards"), "--data.tokenizer", "bpe", "--out_dir",
                 str(tmp_path / "run3"), *TINY, "--train.max_steps", "2"]) == 2
    assert "differs from the tokenizer" in capsys.readouterr().err


def test_a_transformers_tokenizer_directory_is_a_pretrained_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    tk = save_word_tokenizer(tmp_path / "tokenizer.json")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(tmp_path / "hf_tok"))
    tokenizer = load_pretrained_tokenizer(tmp_path / "hf_tok")
    assert tokenizer.eos_id == tk.token_to_id("</s>") and tokenizer.encode("Line 1") == tk.encode("Line 1").ids


@pytest.mark.parametrize(("value", "says"), [
    ("hf:", "data.tokenizer"), ("hf:{tmp}/missing.json", "tokenizer not found"), ("hf:{tmp}", "holds no tokenizer")])
def test_a_bad_pretrained_tokenizer_is_one_line(tmp_path, capsys, value, says):
    (tmp_path / "corpus.txt").write_text(TEXT)
    assert main(["train", "--data.source", str(tmp_path / "corpus.txt"), "--data.tokenizer",
                 value.format(tmp=tmp_path), "--out_dir", str(tmp_path / "run"), *TINY, "--train.max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
