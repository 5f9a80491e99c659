import json

import pytest
import torch

from fullband.data import (
    IGNORE_INDEX,
    ByteTokenizer,
    DataError,
    SFTBatches,
    collate_sft,
    encode_chat,
    load_sft,
)

M = IGNORE_INDEX
TOK = ByteTokenizer()
EOS = TOK.eos_id


def _write(path, *records):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_prompt_completion_masking(tmp_path):
    f = _write(tmp_path / "d.jsonl", {"prompt": "Q:", "completion": "ok"})
    (ex,) = load_sft(f, TOK, max_len=64)
    assert ex.input_ids == [ord("Q"), ord(":"), ord("o"), ord("k"), EOS]
    assert ex.labels == [M, M, ord("o"), ord("k"), EOS]


def test_chat_masking_exact_positions(tmp_path):
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "!"},
    ]
    f = _write(tmp_path / "chat.jsonl", {"messages": msgs})
    (ex,) = load_sft(f, TOK, max_len=512)
    text = "<|system|>\ns\n<|user|>\nhi\n<|assistant|>\n"
    a1 = len(text)
    text2 = "<|user|>\n?\n<|assistant|>\n"
    expected_ids = [*text.encode(), ord("y"), ord("o"), EOS, *text2.encode(), ord("!"), EOS]
    assert ex.input_ids == expected_ids
    kept = [i for i, lab in enumerate(ex.labels) if lab != M]
    a2 = a1 + 3 + len(text2)
    assert kept == [a1, a1 + 1, a1 + 2, a2, a2 + 1]
    assert [ex.labels[i] for i in kept] == [ord("y"), ord("o"), EOS, ord("!"), EOS]
    prompt = encode_chat(TOK, msgs[:2], add_generation_prompt=True)
    assert prompt.input_ids == expected_ids[:a1]  # inference prompt == training prefix


def test_truncation_and_skip(tmp_path):
    f = _write(tmp_path / "d.jsonl", {"prompt": "abc", "completion": "defgh"}, {"prompt": "x" * 20, "completion": "y"})
    with pytest.warns(UserWarning, match="skipped 1 example"):
        (ex,) = load_sft(f, TOK, max_len=5)
    assert ex.input_ids == list(b"abcde") and ex.labels == [M, M, M, ord("d"), ord("e")]


def test_collate_right_pads():
    a = load_like([1, 2, 3], [M, 2, 3])
    b = load_like([4], [4])
    ids, labels = collate_sft([a, b], pad_id=EOS)
    assert ids.tolist() == [[1, 2, 3], [4, EOS, EOS]]
    assert labels.tolist() == [[M, 2, 3], [4, M, M]]
    assert ids.dtype == labels.dtype == torch.long


def load_like(ids, labels):
    from fullband.data import SFTExample

    return SFTExample(ids, labels)


def test_sft_batches_deterministic(tmp_path):
    f = _write(tmp_path / "d.jsonl", *({"prompt": f"p{i}", "completion": "c" * i} for i in range(1, 9)))
    exs = load_sft(f, TOK, max_len=32)
    sb = SFTBatches(exs, batch_size=4, pad_id=EOS, seed=1)
    x, y = sb.batch(7)
    assert torch.equal(x, SFTBatches(exs, 4, EOS, seed=1).batch(7)[0])
    r0, r1 = (sb.batch(7, rank=r, world_size=2) for r in range(2))
    for half, rows in ((r0, slice(0, 2)), (r1, slice(2, 4))):
        w = half[0].shape[1]
        assert torch.equal(half[0], x[rows, :w]) and torch.equal(half[1], y[rows, :w])


def test_sft_curriculum_draws_from_a_growing_prefix_of_the_file(tmp_path):
    f = _write(tmp_path / "d.jsonl", *({"prompt": "p", "completion": "c" * i} for i in range(1, 41)))
    exs = load_sft(f, TOK, max_len=64)
    sb = SFTBatches(exs, batch_size=4, pad_id=EOS, seed=0, curriculum_steps=10)
    assert [sb.pool(s) for s in (0, 1, 5, 10, 99)] == [4, 4, 20, 40, 40]
    # Early batches hold only the first (shortest) examples: at most 4 completion tokens + EOS + the prompt.
    for step in range(2):
        assert sb.batch(step)[0].shape[1] <= 1 + 4 + 1
    assert max(SFTBatches(exs, 4, EOS, seed=0).batch(s)[0].shape[1] for s in range(5)) > 6  # no curriculum


def test_malformed_lines_name_file_and_line(tmp_path):
    f = _write(tmp_path / "bad.jsonl", {"prompt": "a", "completion": "b"}, "", "{not json")
    with pytest.raises(DataError, match=r"bad\.jsonl:3: invalid JSON"):
        load_sft(f, TOK, 16)
    f = _write(tmp_path / "bad2.jsonl", {"text": "x"})
    with pytest.raises(DataError, match=r"bad2\.jsonl:1: expected an object with 'prompt' and 'completion'"):
        load_sft(f, TOK, 16)
    bot = {"messages": [{"role": "bot", "content": "x"}]}
    f = _write(tmp_path / "bad3.jsonl", {"prompt": "a", "completion": "b"}, bot)
    with pytest.raises(DataError, match=r"bad3\.jsonl:2: messages\[0\] must be"):
        load_sft(f, TOK, 16)
    f = _write(tmp_path / "bad4.jsonl", {"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(DataError, match=r"bad4\.jsonl:1: 'messages' has no assistant turn"):
        load_sft(f, TOK, 16)
    with pytest.raises(DataError, match="SFT data file not found"):
        load_sft(tmp_path / "missing.jsonl", TOK, 16)
    with pytest.raises(DataError, match="no usable examples"):
        load_sft(_write(tmp_path / "empty.jsonl", ""), TOK, 16)
