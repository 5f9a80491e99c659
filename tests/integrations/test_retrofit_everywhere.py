"""A retrofitted checkpoint is accepted wherever a model is: ``generate``, ``eval``, ``eval-reasoning``,
``eval-state`` (and ``train --init_from``, tests/integrations/test_retrofit_train_cli.py), ``hf:PATH`` loads a plain
transformers model retrofitted on the fly, and transformers itself opens the retrofitted directory through its
remote code."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import torch
from conftest import LM_EVAL_CLI, save_strong_retrofit

from fullband.cli import main
from fullband.data import ByteTokenizer
from fullband.families import load_any
from fullband.generation import generate
from fullband.integrations.retrofit import RetrofittedLM

LM_EVAL_TASKS = Path(__file__).parent.parent / "data" / "lm_eval"


pytestmark = pytest.mark.usefixtures("one_thread_per_module")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(plain GPT-2 directory, its retrofitted checkpoint with a strong fusion, the retrofitted model)."""
    # n_positions 256: every lm-eval test document fits one window
    return save_strong_retrofit(tmp_path_factory.mktemp("retrofit"), n_positions=256)


def generated(capsys) -> str:
    return capsys.readouterr().out.rstrip("\n")


def test_generate_accepts_a_retrofitted_checkpoint_and_hf_paths(dirs, capsys):
    gpt2_dir, retro_dir, model = dirs
    prompt = "To be"
    ids = ByteTokenizer().encode(prompt)
    outputs = {}
    for name, spec, mode in (("retro-soft", retro_dir, "soft"), ("retro-standard", retro_dir, "standard"),
                             ("hf-standard", f"hf:{gpt2_dir}", "standard")):
        assert main(["generate", "--checkpoint", str(spec), "--prompt", prompt, "--decode.mode", mode,
                     "--max_new_tokens", "8", "--stop_at_eos", "false"]) == 0
        outputs[name] = generated(capsys)
    expected = ByteTokenizer().decode(generate(model, ids, max_new_tokens=8, mode="soft")[len(ids):])
    assert outputs["retro-soft"] == prompt + expected
    # Standard mode is the pretrained network itself, so the fresh hf: retrofit decodes the same tokens.
    assert outputs["retro-standard"] == outputs["hf-standard"] != outputs["retro-soft"]
    assert isinstance(load_any(f"hf:{gpt2_dir}"), RetrofittedLM)


@pytest.fixture(scope="module")
def eval_scores(dirs, tmp_path_factory) -> dict[str, dict]:
    """``fullband eval`` (in this process) on fb_tiny_ppl: the retrofitted checkpoint in standard and soft mode and
    the plain GPT-2 through ``hf:`` in standard mode; computed once for the tests that compare against them."""
    gpt2_dir, retro_dir, _ = dirs
    scores = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(LM_EVAL_TASKS)  # the task's data_files path is relative
        for name, spec, mode in (("retro", retro_dir, "standard"), ("hf", f"hf:{gpt2_dir}", "standard"),
                                 ("retro-soft", retro_dir, "soft")):
            out = tmp_path_factory.mktemp(name)
            assert main(["eval", "--checkpoint", str(spec), "--tasks", "fb_tiny_ppl", "--include_path", ".",
                         "--include_defaults", "false", "--decode.mode", mode, "--out_dir", str(out)]) == 0
            scores[name] = json.loads((out / "results.json").read_text())["results"]["fb_tiny_ppl"]
    return scores


def test_eval_accepts_a_retrofitted_checkpoint(eval_scores):
    scores = {name: result["bits_per_byte,none"] for name, result in eval_scores.items()}
    assert scores["retro"] == pytest.approx(scores["hf"], rel=1e-6)  # standard = the pretrained network
    assert abs(scores["retro-soft"] - scores["retro"]) > 1e-3


def _replace_fullband_model(out_dir: Path, model: RetrofittedLM) -> None:
    target = out_dir / "fullband" / "model"
    shutil.rmtree(target)
    model.save_pretrained(target)
    ByteTokenizer().save(target)


def test_eval_reasoning_evaluates_a_retrofitted_model(dirs, tmp_path):
    out = tmp_path / "reasoning"
    args = ["eval-reasoning", "--preset", "smoke", "--out_dir", str(out), "--progress", "false"]
    assert main(args) == 0
    _replace_fullband_model(out, dirs[2])
    assert main([*args, "--reuse_models", "true"]) == 0
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert {c["mode"] for c in cells if c.get("model") == "fullband"} == {"standard", "soft", "fused", "exact"}
    assert all(c["n"] > 0 and 0 <= c["accuracy"] <= 1 for c in cells)


def test_eval_state_probes_a_retrofitted_model(dirs, tmp_path):
    out = tmp_path / "state"
    args = ["eval-state", "--preset", "smoke", "--out_dir", str(out), "--progress", "false"]
    assert main(args) == 0
    _replace_fullband_model(out, dirs[2])
    assert main([*args, "--reuse_models", "true"]) == 0
    assert (out / "report.md").is_file()


def test_transformers_opens_the_retrofitted_checkpoint_with_remote_code(dirs, tmp_path):
    _, retro_dir, model = dirs
    tokens = [[5, 9, 77, 3, 120, 44, 2]]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code = f"""
        import json, sys, torch
        from transformers import AutoModelForCausalLM
        assert "fullband" not in sys.modules
        model = AutoModelForCausalLM.from_pretrained({str(retro_dir)!r}, trust_remote_code=True)
        ids = torch.tensor({tokens})
        print(json.dumps({{"module": type(model).__module__, "logits": model(ids).logits.tolist(),
                          "soft": model.generate(ids, max_new_tokens=6, do_sample=False,
                                                 decoding_mode="soft").tolist()}}))
    """
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["module"].startswith("transformers_modules.")
    ids = torch.tensor(tokens)
    with torch.no_grad():
        base_logits = model.base(ids).logits  # standard scoring = the pretrained network
    torch.testing.assert_close(torch.tensor(got["logits"]), base_logits, atol=1e-5, rtol=1e-5)
    assert got["soft"] == generate(model, ids, max_new_tokens=6, mode="soft").tolist()


def test_lm_eval_cli_hf_model_scores_a_retrofitted_checkpoint_as_fullband_eval(dirs, eval_scores, tmp_path):
    """``lm_eval --model hf`` (remote code) in soft mode == ``fullband eval --decode.mode soft`` on a retrofitted
    model."""
    _, retro_dir, _ = dirs
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    lm_eval_out = tmp_path / "lm_eval"
    argv = ["--model", "hf", "--model_args",
            f"pretrained={retro_dir},trust_remote_code=True,decoding_mode=soft,score_mode=soft",
            "--tasks", "fb_tiny_ppl", "--include_path", ".", "--device", "cpu", "--batch_size", "4",
            "--output_path", str(lm_eval_out)]
    run = subprocess.run([sys.executable, "-c", LM_EVAL_CLI, json.dumps([argv])], capture_output=True, text=True,
                         env=env, cwd=LM_EVAL_TASKS, timeout=300)  # conftest: lm-eval's CLI entry point
    assert run.returncode == 0, run.stderr[-3000:]
    (result_file,) = lm_eval_out.rglob("results_*.json")
    theirs = json.loads(result_file.read_text())["results"]["fb_tiny_ppl"]
    ours = eval_scores["retro-soft"]  # fullband eval --decode.mode soft on the same checkpoint
    assert theirs["bits_per_byte,none"] == pytest.approx(ours["bits_per_byte,none"], rel=1e-5)
