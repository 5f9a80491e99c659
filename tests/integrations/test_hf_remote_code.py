"""Checkpoints open in transformers-based tools with no ``import fullband`` first: ``auto_map`` + remote code,
tokenizer files ``AutoTokenizer`` reads, a model card, and lm-eval's own ``--model hf`` CLI giving the scores of
``fullband eval``. Every transformers / lm-eval process runs offline with its caches in a temporary directory."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import LM_EVAL_CLI, make_model

from fullband import hub
from fullband.cli import main
from fullband.data import ByteTokenizer, load_tokenizer, train_bpe
from fullband.generation import generate

LM_EVAL_TASKS = Path(__file__).parent.parent / "data" / "lm_eval"  # fb_tiny_ppl: rolling loglikelihood, offline


def offline_env(tmp: Path) -> dict[str, str]:
    """No hub access, and every cache (remote-code modules, datasets) under ``tmp``, not the user's."""
    return {**os.environ, "HF_HOME": str(tmp / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_python(code: str, tmp: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=offline_env(tmp), cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A byte-tokenizer checkpoint whose fusion is strong, so soft and standard scores clearly differ."""
    path = tmp_path_factory.mktemp("ckpt")
    model = make_model(vocab_size=320, max_seq_len=256, dtype=torch.float32)
    with torch.no_grad():
        model.fusion.state_proj.weight.mul_(20)
    model.save_pretrained(path)
    ByteTokenizer().save(path)
    return path, model


def test_the_directory_holds_what_transformers_needs(checkpoint):
    path, _ = checkpoint
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "fullband" and config["architectures"] == ["FullBandwidthForCausalLM"]
    assert config["auto_map"] == {"AutoConfig": "configuration_fullband.FullBandwidthConfig",
                                  "AutoModelForCausalLM": "modeling_fullband.FullBandwidthForCausalLM"}
    assert config["decoding_mode"] == "soft" and config["score_mode"] == "standard"
    for name in ("configuration_fullband.py", "modeling_fullband.py"):
        assert "pip install fullband" in (path / name).read_text()
    card = (path / "README.md").read_text()
    assert "2 layers, width 32" in card and "Training tokens:** not recorded" in card
    assert "trust_remote_code=True" in card and "`soft`" in card


def test_trust_remote_code_load_without_importing_fullband(checkpoint, tmp_path):
    path, model = checkpoint
    tokens = [[5, 9, 77, 3, 120, 44, 2]]
    out = run_python(f"""
        import json, sys, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        assert "fullband" not in sys.modules
        ids = torch.tensor({tokens})
        result = {{}}
        for score_mode in ("standard", "soft"):
            model = AutoModelForCausalLM.from_pretrained({str(path)!r}, trust_remote_code=True, score_mode=score_mode)
            result[score_mode] = model(ids).logits.tolist()
            result.setdefault("module", type(model).__module__)  # of the first load, before fullband was imported
        result["soft"] = [result["soft"], model.generate(ids, max_new_tokens=6, do_sample=False,
                                                         decoding_mode="soft").tolist()]
        result["fused"] = model.generate(ids, max_new_tokens=6, do_sample=False, decoding_mode="fused:2").tolist()
        tok = AutoTokenizer.from_pretrained({str(path)!r})
        result["tok"] = [tok("héllo <|endoftext|>", add_special_tokens=False).input_ids, tok.eos_token_id]
        print(json.dumps(result))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["module"].startswith("transformers_modules.")  # the checkpoint's own remote code, not an import
    ids = torch.tensor(tokens)
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(got["standard"]), model(ids).logits, atol=1e-5, rtol=1e-5)
        # score_mode=soft: position 1 plain, the rest the exact recurrence.
        exact = model.forward_exact(ids, plain_prefix=1).logits
        torch.testing.assert_close(torch.tensor(got["soft"][0]), exact, atol=1e-5, rtol=1e-5)
    assert got["soft"][1] == generate(model, ids, max_new_tokens=6, mode="soft").tolist()
    assert got["fused"] == generate(model, ids, max_new_tokens=6, mode="fused:2").tolist()
    assert got["tok"] == [ByteTokenizer().encode("héllo <|endoftext|>"), ByteTokenizer.eos_id]


def test_a_nope_checkpoint_opens_through_remote_code_with_its_encoding(tmp_path):
    """A model without a positional encoding, opened by a process that never imported fullband: its config keeps
    position_encoding='none' and its logits (score_mode standard, the default) and soft greedy tokens are the
    native model's."""
    model = make_model(dtype=torch.float32, position_encoding="none")
    model.save_pretrained(tmp_path / "ckpt")
    tokens = [[5, 9, 17, 3, 40, 44, 2]]
    out = run_python(f"""
        import json, sys, torch
        from transformers import AutoModelForCausalLM
        assert "fullband" not in sys.modules
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "ckpt")!r}, trust_remote_code=True)
        ids = torch.tensor({tokens})
        print(json.dumps({{"module": type(model).__module__, "encoding": model.config.position_encoding,
                          "logits": model(ids).logits.tolist(),
                          "soft": model.generate(ids, max_new_tokens=6, do_sample=False,
                                                 decoding_mode="soft").tolist()}}))
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["module"].startswith("transformers_modules.") and got["encoding"] == "none"
    ids = torch.tensor(tokens)
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(got["logits"]), model(ids).logits, atol=1e-5, rtol=1e-5)
    assert got["soft"] == generate(model, ids, max_new_tokens=6, mode="soft").tolist()


def test_without_fullband_installed_the_error_says_pip_install_fullband(checkpoint, tmp_path):
    path, _ = checkpoint
    out = run_python(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):  # as if fullband were not installed
            def find_spec(self, name, path=None, target=None):
                if name == "fullband" or name.startswith("fullband."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}")
        sys.meta_path.insert(0, Block())
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained({str(path)!r}, trust_remote_code=True)
        except ImportError as err:
            print(str(err).splitlines()[0])
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pip install fullband" in out.stdout


def test_bpe_tokenizer_files_give_the_same_ids_in_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    text = "Now is the winter of our discontent <|endoftext|> made glorious summer"
    train_bpe([text * 3, "the winter of our", "summer made glorious"], vocab_size=300).save(tmp_path)
    ours = load_tokenizer(tmp_path)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    assert theirs(text, add_special_tokens=False).input_ids == ours.encode(text)
    assert theirs.eos_token_id == ours.eos_id
    assert theirs.decode(ours.encode(text)) == text


@pytest.fixture(scope="module")
def lm_eval_scores(checkpoint, tmp_path_factory) -> dict[str, dict]:
    """``lm_eval --model hf`` (remote code) on the checkpoint, per mode: one process (conftest's ``LM_EVAL_CLI``),
    one CLI run per mode."""
    path, _ = checkpoint
    tmp = tmp_path_factory.mktemp("lm_eval")
    runs = {mode: ["--model", "hf", "--model_args",
                   f"pretrained={path},trust_remote_code=True,decoding_mode={mode},score_mode={mode}",
                   "--tasks", "fb_tiny_ppl", "--include_path", ".", "--device", "cpu", "--batch_size", "4",
                   "--output_path", str(tmp / f"lm_eval_{mode}")] for mode in ("standard", "soft")}
    run = subprocess.run([sys.executable, "-c", LM_EVAL_CLI, json.dumps(list(runs.values()))], capture_output=True,
                         text=True, env=offline_env(tmp), cwd=LM_EVAL_TASKS, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    scores = {}
    for mode in runs:
        (result_file,) = (tmp / f"lm_eval_{mode}").rglob("results_*.json")
        scores[mode] = json.loads(result_file.read_text())["results"]["fb_tiny_ppl"]
    return scores


@pytest.fixture(scope="module")
def fullband_scores(checkpoint, tmp_path_factory, one_thread_per_module):
    """``fullband eval``'s scores of the checkpoint per mode, each computed once for the module, in this process
    (the CLI's ``main``; the subprocess under test is lm-eval's)."""
    path, _ = checkpoint
    scores: dict[str, dict] = {}

    def score(mode: str) -> dict:
        if mode not in scores:
            out_dir = tmp_path_factory.mktemp(f"fullband_eval_{mode}")
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(LM_EVAL_TASKS)  # the task's data_files path is relative
                assert main(["eval", "--checkpoint", str(path), "--tasks", "fb_tiny_ppl", "--include_path", ".",
                             "--include_defaults", "false", "--decode.mode", mode, "--out_dir", str(out_dir)]) == 0
            scores[mode] = json.loads((out_dir / "results.json").read_text())["results"]["fb_tiny_ppl"]
        return scores[mode]

    return score


@pytest.mark.parametrize("mode", ["standard", "soft"])
def test_lm_eval_cli_hf_model_scores_equal_fullband_eval(lm_eval_scores, fullband_scores, mode):
    """``lm_eval --model hf`` on the checkpoint == ``fullband eval``: every document fits one window, so lm-eval's
    rolling context is the end-of-text token alone and soft mode means the same positions in both."""
    theirs, ours = lm_eval_scores[mode], fullband_scores(mode)
    for metric in ("bits_per_byte,none", "byte_perplexity,none", "word_perplexity,none"):
        assert theirs[metric] == pytest.approx(ours[metric], rel=1e-5), metric
    if mode == "soft":  # and the mode matters: soft is not standard
        standard = fullband_scores("standard")
        assert abs(standard["bits_per_byte,none"] - ours["bits_per_byte,none"]) > 1e-3


def test_model_card_keeps_a_users_readme_and_records_training(tmp_path):
    model = make_model()
    (tmp_path / "README.md").write_text("my notes\n")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "README.md").read_text() == "my notes\n"
    other = tmp_path / "other"
    model.save_pretrained(other)
    config = json.loads((other / "config.json").read_text())
    hub.write_model_card(other, config, {"tokens": 123456, "steps": 10, "token_equiv_compute": 200000,
                                         "data": "shakespeare"})
    model.save_pretrained(other)  # saving again keeps what the trainer recorded
    card = (other / "README.md").read_text()
    assert "123,456 tokens (200,000 token-equivalent compute" in card and "`shakespeare`" in card


def test_older_checkpoints_whose_config_has_only_the_model_fields_still_load(tmp_path):
    from fullband import FullBandwidthLM

    model = make_model(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))  # as written before auto_map
    loaded = FullBandwidthLM.from_pretrained(tmp_path)
    assert loaded.config == model.config
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, passes=2).logits, model(tokens, passes=2).logits, atol=0, rtol=0)
