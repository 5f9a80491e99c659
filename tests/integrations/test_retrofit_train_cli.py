"""``fullband train --init_from hf:PATH``: retrofit a transformers causal LM saved on disk (here a tiny GPT-2 with a
tiny BPE tokenizer, built offline), fine-tune it with the multi-pass objective (text and SFT), resume it bit for
bit, and decode from the result with ``fullband generate``."""

import json
import os
import shutil

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

from fullband.cli import main
from fullband.data import TransformersTokenizer, load_tokenizer
from fullband.families import load_any
from fullband.generation import generate
from fullband.integrations.retrofit import RetrofittedLM

SENTENCE = "the king and the queen walk to the castle while a fox runs over the green hill and every bird sings"
WORDS = SENTENCE.split()
TINY = ["--train.batch_size", "2", "--train.seq_len", "24", "--train.eval_batches", "1", "--optim.warmup_steps", "1",
        "--optim.lr", "3e-3", "--train.log_every", "1", "--device", "cpu", "--train.eval_every", "0",
        # AdamW on every parameter, as these tests were written (Muon on a retrofit's matrices: issue 26)
        "--optim.optimizer", "adamw", "--optim.fusion_lr_mult", "1"]


pytestmark = pytest.mark.usefixtures("one_thread_per_module")  # conftest: torch on one thread


def corpus_text(n_lines: int = 200) -> str:
    g = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(n_lines):
        idx = torch.randint(0, len(WORDS), (8,), generator=g).tolist()
        lines.append(" ".join(WORDS[i] for i in idx).capitalize() + ".")
    return "\n".join(lines) + "\n"  # about 8 KB


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny GPT-2 and its tokenizer, saved with save_pretrained as a pretrained model would be."""
    directory = tmp_path_factory.mktemp("gpt2")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(directory)  # dropout 0.1 (the default): resume must restore its RNG
    return directory


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(corpus_text())
    return path


def train(out_dir, hf_dir, *extra) -> int:
    return main(["train", "--out_dir", str(out_dir), "--init_from", f"hf:{hf_dir}", *TINY, *extra])


def records(out_dir):
    return [r for r in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def test_tokenizer_adapter_saves_beside_fullbands_marker_and_loads_back(hf_dir, tmp_path):
    tokenizer = load_tokenizer(hf_dir)  # a transformers save_pretrained directory loads as it is
    assert isinstance(tokenizer, TransformersTokenizer) and tokenizer.bos_id == tokenizer.eos_id == 0
    text = "The fox sings <|endoftext|> of bread."
    ids = tokenizer.encode(text)
    assert tokenizer.eos_id not in ids  # text that spells a special token stays text
    assert tokenizer.decode(ids) == text and tokenizer.encode_batch([text, "hill"]) == [ids, tokenizer.encode("hill")]
    assert tokenizer.decode([*ids, tokenizer.eos_id, 10_000]) == text  # special and out-of-range ids dropped
    tokenizer.save(tmp_path)
    marker = json.loads((tmp_path / "tokenizer_config.json").read_text())
    # One tokenizer_config.json: transformers' own keys plus fullband's, so AutoTokenizer reads the directory too.
    assert marker["type"] == "hf" and marker["path"] == "." and marker["eos_token"] == "<|endoftext|>"
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(tmp_path))(text, add_special_tokens=False).input_ids == ids
    back = load_tokenizer(tmp_path)
    assert back.encode(text) == ids and back.fingerprint == tokenizer.fingerprint
    assert back.config() == tokenizer.config()


def test_train_retrofitted_gpt2_then_generate(hf_dir, text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, hf_dir, "--data.source", str(text_file), "--train.max_steps", "4",
                 "--schedule.feedback_start", "0.5", "--retrofit.feedback_source", "1") == 0
    assert [r["passes"] for r in records(out)][:2] == [1, 1] and all(r["passes"] >= 2 for r in records(out)[2:])
    model_dir = out / "model"
    assert {"retrofit.json", "fusion.safetensors", "base", "tokenizer_config.json", "config.json", "README.md",
            "modeling_fullband.py", "configuration_fullband.py"} <= {
        p.name for p in model_dir.iterdir()}
    model = load_any(model_dir)
    assert isinstance(model, RetrofittedLM) and model.config.feedback_source == 1
    assert not model.training and model.config.base_architecture == "GPT2LMHeadModel"
    # Four steps leave the fused inputs at the embeddings' tiny scale (their init), so soft and exact decoding
    # would write the same tokens; a larger fused input makes the modes differ, which shows --decode.mode is used.
    with torch.no_grad():
        model.fusion.out_norm.weight.mul_(100)
    model.save_pretrained(model_dir)
    capsys.readouterr()
    tokenizer = load_tokenizer(model_dir)
    prompt = tokenizer.encode("The king")
    outputs = []
    for mode in ("soft", "exact"):
        assert main(["generate", "--checkpoint", str(model_dir), "--prompt", "The king", "--max_new_tokens", "6",
                     "--decode.mode", mode]) == 0
        new = generate(model, prompt, 6, mode=mode, stop_token_ids=[tokenizer.eos_id])[len(prompt) :]
        new = new[: new.index(tokenizer.eos_id)] if tokenizer.eos_id in new else new
        assert capsys.readouterr().out == "The king" + tokenizer.decode(new) + "\n"  # the model's own tokens
        outputs.append(new)
    assert outputs[0] != outputs[1]  # two modes, two continuations: --decode.mode reached the decoder


def test_sft_fine_tune_with_three_passes(hf_dir, tmp_path):
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"Where does the {w} go?", "completion": f" To the {w} hill."} for w in WORDS[:12]]
    rows.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "sft"
    assert train(out, hf_dir, "--data.format", "sft", "--data.source", str(data), "--schedule.feedback_start", "0",
                 "--schedule.pass_mix", "0,1", "--train.max_steps", "2", "--train.seq_len", "32") == 0
    assert [r["passes"] for r in records(out)] == [3, 3]
    assert all(len(r["pass_losses"]) == 3 for r in records(out))
    assert isinstance(load_any(out / "model"), RetrofittedLM)


def test_resumed_run_reproduces_the_uninterrupted_losses(hf_dir, text_file, tmp_path):
    out = tmp_path / "run"
    args = ["--data.source", str(text_file), "--train.max_steps", "4", "--train.checkpoint_every", "2",
            "--schedule.feedback_start", "0.25"]
    assert train(out, hf_dir, *args) == 0
    uninterrupted = records(out)
    step2 = out / "checkpoints" / "step-0000002"
    assert {"retrofit.json", "fusion.safetensors", "base", "tokenizer_config.json", "optimizer.pt"} <= {
        p.name for p in step2.iterdir()}
    shutil.rmtree(out / "checkpoints" / "step-0000004")  # interrupted after step 2
    assert train(out, hf_dir, *args, "--resume", "true") == 0
    resumed = records(out)
    assert [r["objective"] for r in resumed] == [r["objective"] for r in uninterrupted]
    assert [r["pass_losses"] for r in resumed] == [r["pass_losses"] for r in uninterrupted]
    # A corrupted retrofit checkpoint is skipped, not loaded: the run resumes from the one before.
    fusion = out / "checkpoints" / "step-0000004" / "fusion.safetensors"
    fusion.write_bytes(fusion.read_bytes()[:-8])
    with pytest.warns(UserWarning, match="fusion.safetensors has"):
        assert train(out, hf_dir, *args, "--resume", "true") == 0
    assert [r["objective"] for r in records(out)] == [r["objective"] for r in uninterrupted]


def test_init_from_a_retrofitted_model_continues_it(hf_dir, text_file, tmp_path):
    first = tmp_path / "first"
    assert train(first, hf_dir, "--data.source", str(text_file), "--train.max_steps", "1",
                 "--retrofit.feedback_source", "1") == 0
    second = tmp_path / "second"
    assert main(["train", "--out_dir", str(second), "--init_from", str(first / "model"), *TINY,
                 "--data.source", str(text_file), "--train.max_steps", "1", "--schedule.feedback_start", "0"]) == 0
    before, after = load_any(first / "model"), load_any(second / "model")
    assert after.config == before.config  # feedback source 1 kept
    assert not torch.equal(after.fusion.state_proj.weight, before.fusion.state_proj.weight)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory, hf_dir):
    directory = tmp_path_factory.mktemp("t5")
    T5ForConditionalGeneration(T5Config(vocab_size=300, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                        num_heads=2)).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, directory / name)
    return directory


@pytest.mark.parametrize(
    ("init_from", "extra", "message"),
    [
        ("hf:{tmp}/nowhere", [], "is not a directory; give the local directory"),
        ("hf:{t5}", [], "is not a transformers causal LM that AutoModelForCausalLM can load: Unrecognized "
                        "configuration class"),
        ("hf:{tmp}", [], "cannot load a transformers tokenizer from"),
        ("hf:{gpt2}", ["--retrofit.feedback_source", "2"], "retrofit.feedback_source=2 is invalid"),
        ("hf:{gpt2}", ["--retrofit.feedback_source", "top"], "retrofit.feedback_source='top' is invalid"),
        ("hf:", [], "init_from='hf:' is invalid: give the directory after hf:"),
        ("{gpt2}", [], "is a transformers 'gpt2' model, not a fullband one; use init_from='hf:"),
        ("hf:{gpt2}", ["--train.seq_len", "100", "--data.source", "{text}"], "must be at most the model's "
                                                                             "max_seq_len=64"),
        (None, ["--retrofit.feedback_source", "1"], "retrofit.feedback_source='1' is invalid: applies only to "
                                                    "init_from='hf:PATH'"),
        ("hf:{gpt2}", ["--train.seq_len", "100", "--data.format", "sft", "--data.source", "{tmp}/nowhere.jsonl"],
         "SFT data file not found"),
    ],
)
def test_bad_inputs_fail_with_one_line(tmp_path, capsys, hf_dir, t5_dir, text_file, init_from, extra, message):
    args = ["train", "--out_dir", str(tmp_path / "run"), *TINY, "--train.max_steps", "1",
            *(arg.format(tmp=tmp_path, text=text_file) for arg in extra)]
    if init_from is not None:
        args += ["--init_from", init_from.format(tmp=tmp_path, t5=t5_dir, gpt2=hf_dir)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_fsdp_is_refused_for_a_retrofitted_model(hf_dir, text_file, tmp_path, capsys, monkeypatch):
    from fullband.training import run
    from fullband.training.distributed import DistributedEnv

    # Rank 0 of 2 without a process group: the refusal comes before anything collective.
    monkeypatch.setattr(run, "init_distributed", lambda: DistributedEnv(0, 0, 2))
    assert train(tmp_path / "run", hf_dir, "--data.source", str(text_file), "--train.max_steps", "1",
                 "--train.parallel", "fsdp") == 2
    assert "train.parallel='fsdp' is invalid for a retrofitted transformers model" in capsys.readouterr().err
