import math

import numpy as np
import pytest
import torch

from fullband.data import (
    ByteTokenizer,
    DataError,
    TokenBatches,
    bits_per_byte,
    encode_documents,
    eval_windows,
    load_tokens,
)
from fullband.data import shards as shards_mod


def test_bits_per_byte_arithmetic():
    assert bits_per_byte(math.log(2), 100, 100) == pytest.approx(1.0)
    # 1000 tokens at 2 nats each covering 4000 bytes: 2000 nats / (4000 ln 2) bits
    assert bits_per_byte(2.0, 1000, 4000) == pytest.approx(2000 / (4000 * math.log(2)))
    with pytest.raises(DataError, match="positive byte count"):
        bits_per_byte(1.0, 10, 0)


def test_encode_documents_eos_between():
    tok = ByteTokenizer()
    arr = encode_documents(["ab", "é"], tok)
    assert arr.dtype == np.uint16
    assert arr.tolist() == [97, 98, 256, 0xC3, 0xA9]
    assert shards_mod.token_dtype(65536) == np.uint16 and shards_mod.token_dtype(65537) == np.uint32


def test_load_tokens_cached(tmp_path, monkeypatch):
    corpus = tmp_path / "c"
    corpus.mkdir()
    for i in range(5):
        (corpus / f"{i}.txt").write_text(f"doc {i} ünïcode\n" * 50)
    cache = tmp_path / "cache"
    first = load_tokens(corpus, "train", ByteTokenizer(), cache=cache)
    assert isinstance(first.tokens, np.memmap) and first.path is not None and first.path.is_file()
    # Validation and test hold out the first 10% of the bytes (here 25 whole lines of file 0): training keeps the
    # rest of file 0 and the 4 other files (fullband.data.splits.split_files).
    size = len(("doc 0 ünïcode\n" * 50).encode())
    assert first.n_docs == 5
    assert first.n_bytes == 5 * size - 25 * len("doc 0 ünïcode\n".encode()) == round(0.9 * 5 * size)
    assert first.n_tokens == first.n_bytes + first.n_docs - 1  # bytes + eos between documents
    assert first.bits_per_byte(math.log(2)) == pytest.approx(first.n_tokens / first.n_bytes)

    calls = []
    monkeypatch.setattr(shards_mod, "encode_documents", lambda *a: calls.append(a))
    again = load_tokens(corpus, "train", ByteTokenizer(), cache=cache)
    assert calls == [] and again.path == first.path
    assert np.array_equal(again.tokens, first.tokens)
    # an edited corpus gets a new cache entry, never the stale one
    monkeypatch.undo()
    for f in corpus.iterdir():
        f.write_text(f"changed {f.name}\n")
    assert load_tokens(corpus, "train", ByteTokenizer(), cache=cache).path != first.path


def test_token_batches_deterministic_and_rank_slices():
    tokens = np.arange(1000, dtype=np.uint16)
    tb = TokenBatches(tokens, seq_len=16, batch_size=8, seed=3)
    x, y = tb.batch(5)
    assert x.shape == (8, 16) and x.dtype == torch.long
    assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.long))  # contiguous windows
    again = TokenBatches(tokens, seq_len=16, batch_size=8, seed=3)
    assert torch.equal(again.batch(5)[0], x)  # pure function of (seed, step)
    assert not torch.equal(tb.batch(6)[0], x)
    assert not torch.equal(TokenBatches(tokens, 16, 8, seed=4).batch(5)[0], x)
    parts = [tb.batch(5, rank=r, world_size=2)[0] for r in range(2)]
    assert all(p.shape == (4, 16) for p in parts)
    assert torch.equal(torch.cat(parts), x)
    quarters = [tb.batch(5, rank=r, world_size=4)[0] for r in range(4)]
    assert torch.equal(torch.cat(quarters), x)
    # windows can reach the very last token
    ends = np.concatenate([TokenBatches(np.arange(18), 16, 64, seed=s).offsets(0) for s in range(4)])
    assert set(ends.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("lengths", [(20, 17, 16, 40), (16, 30), (5, 25, 3, 18)])
def test_a_global_start_maps_to_a_window_inside_one_shard_at_every_shard_boundary(lengths):
    """The first and last window of each shard, and the start after a shard's last window, which must open the
    next shard (with windows) rather than run across the boundary. Shards shorter than a window hold none."""
    seq_len = 16
    shards = [np.arange(1000 * i, 1000 * i + n, dtype=np.uint16) for i, n in enumerate(lengths)]
    tb = TokenBatches(shards, seq_len, batch_size=4)
    counts = [max(0, n - seq_len + 1) for n in lengths]
    assert tb.n_windows == sum(counts)
    with_windows = [i for i, c in enumerate(counts) if c]
    before = 0
    for i in with_windows:
        first, last = before, before + counts[i] - 1
        assert tb.locate(np.array([first, last])) == [(i, 0), (i, lengths[i] - seq_len)]
        if last + 1 < tb.n_windows:  # one past the last window of shard i: the first window of the next one
            following = with_windows[with_windows.index(i) + 1]
            assert tb.locate(np.array([last + 1])) == [(following, 0)]
        before += counts[i]
    # Every global start, in order, is every window of every shard exactly once; each row read from one shard.
    every = tb.locate(np.arange(tb.n_windows))
    assert every == [(i, s) for i in with_windows for s in range(counts[i])]
    for part, start in every:
        row = shards[part][start : start + seq_len].astype(np.int64)
        assert len(row) == seq_len and (np.diff(row) == 1).all() and row[0] // 1000 == part


def test_token_batches_errors():
    tokens = np.arange(100, dtype=np.uint16)
    with pytest.raises(DataError, match="not divisible by world_size 3"):
        TokenBatches(tokens, 8, 4, seed=0).batch(0, rank=0, world_size=3)
    with pytest.raises(DataError, match="rank 2 out of range"):
        TokenBatches(tokens, 8, 4, seed=0).batch(0, rank=2, world_size=2)
    with pytest.raises(DataError, match=r"at least seq_len \+ 1 = 101 tokens"):
        TokenBatches(tokens, 100, 4, seed=0)
    with pytest.raises(DataError, match=r"at least seq_len \+ 1"):
        next(eval_windows(tokens, 100))


def test_eval_windows():
    tokens = np.arange(103, dtype=np.uint16)
    wins = list(eval_windows(tokens, 10))
    assert len(wins) == 10 and all(w.shape == (1, 10) for w in wins)
    assert torch.equal(torch.cat(wins).flatten(), torch.arange(100))  # non-overlapping, in order
    batched = list(eval_windows(tokens, 10, batch_size=4))
    assert [b.shape[0] for b in batched] == [4, 4, 2]
    spread = torch.cat(list(eval_windows(tokens, 10, max_windows=3)))
    assert spread[:, 0].tolist() == [0, 40, 90]  # evenly spread, first and last included
    with pytest.raises(DataError, match="max_windows must be positive"):
        next(eval_windows(tokens, 10, max_windows=0))
