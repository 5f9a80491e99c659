"""train.compile: compiled blocks train like eager ones, resume bit for bit, and a failing compile falls back."""

import warnings

import pytest
import torch
from test_trainer import make_trainer, records
from torch._inductor.exc import InductorError

from fullband import FullBandwidthLM
from fullband.config import ConfigError
from fullband.training import step_setup
from fullband.training.config import COMPILE_MIN_CPU_STEPS, COMPILE_MIN_CPU_WORK, TrainConfig
from fullband.training.errors import NonFiniteLossError
from fullband.training.step_setup import compile_work, should_compile


def test_compiled_blocks_train_like_eager_blocks_within_float_tolerance(tmp_path):
    eager = make_trainer(tmp_path / "eager", compile="false")
    compiled = make_trainer(tmp_path / "compiled", compile="true")
    assert compiled.compiled and not eager.compiled
    eager.fit()
    compiled.fit()
    expected, got = records(tmp_path / "eager"), records(tmp_path / "compiled")
    assert {r["passes"] for r in expected} == {1, 2, 3}  # multi-pass steps, jitter and prefixes went through them
    for a, b in zip(expected, got, strict=True):
        assert a["step"] == b["step"] and a["passes"] == b["passes"]
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-5)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], rel=1e-5)
    for a, b in zip(eager.raw_model.parameters(), compiled.raw_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # Evaluation and decoding run the eager blocks: no gradients, no compiled code.
    with torch.no_grad():
        tokens = torch.randint(0, 61, (2, 16))
        out = compiled.raw_model(tokens, passes=2)
    assert torch.isfinite(out.logits).all()


def test_resume_with_compiled_blocks_is_bit_exact(tmp_path):
    straight = make_trainer(tmp_path / "straight", compile="true")
    straight.fit()
    first = make_trainer(tmp_path / "resumed", compile="true")
    first.fit(until=4)
    second = make_trainer(tmp_path / "resumed", seed=123, compile="true")
    second.fit(resume=True)
    assert records(tmp_path / "resumed") == records(tmp_path / "straight")
    for a, b in zip(straight.raw_model.parameters(), second.raw_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_failing_compile_warns_and_trains_eagerly(tmp_path, monkeypatch):
    def broken_compile(model):
        def fail(*args, **kwargs):
            raise InductorError(RuntimeError("no working C++ compiler"), None)

        model.__dict__["_compiled_blocks"] = [fail for _ in model.blocks]

    monkeypatch.setattr(FullBandwidthLM, "compile_blocks", broken_compile)
    eager = make_trainer(tmp_path / "eager", compile="false")
    eager.fit()
    fallback = make_trainer(tmp_path / "fallback", compile="true")
    with pytest.warns(UserWarning, match=r"torch.compile failed \(InductorError: RuntimeError: no working C\+\+ "
                                         r"compiler\); training eagerly"):
        fallback.fit()
    assert not fallback.compiled
    # The failed attempt left nothing behind: the same numbers as a run that never tried, bit for bit.
    assert records(tmp_path / "fallback") == records(tmp_path / "eager")


def nan_blocks(model):
    """Compiled blocks whose output is not finite: what inductor kernels cached for another ISA gave (docs/LOG.md)."""
    model.__dict__["_compiled_blocks"] = [lambda x, *args, **kwargs: x * float("nan") for _ in model.blocks]


def test_a_non_finite_first_compiled_step_warns_and_trains_eagerly(tmp_path, monkeypatch):
    monkeypatch.setattr(FullBandwidthLM, "compile_blocks", nan_blocks)
    eager = make_trainer(tmp_path / "eager", compile="false")
    eager.fit()
    fallback = make_trainer(tmp_path / "fallback", compile="true")
    with pytest.warns(UserWarning, match=r"the compiled blocks' first step was not finite; training eagerly"):
        fallback.fit()
    assert not fallback.compiled
    assert records(tmp_path / "fallback") == records(tmp_path / "eager")  # nothing of the failed step was applied


def test_a_model_that_diverges_eagerly_too_still_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(FullBandwidthLM, "compile_blocks", nan_blocks)
    trainer = make_trainer(tmp_path / "run", compile="true")
    with torch.no_grad():
        trainer.raw_model.embed.weight.fill_(float("nan"))
    with pytest.warns(UserWarning, match="training eagerly"), pytest.raises(NonFiniteLossError, match="at step 0"):
        trainer.fit()


def test_errors_that_are_not_the_compilers_are_not_swallowed(tmp_path, monkeypatch):
    def broken_compile(model):
        def fail(*args, **kwargs):
            raise ValueError("a bug in a block")

        model.__dict__["_compiled_blocks"] = [fail for _ in model.blocks]

    monkeypatch.setattr(FullBandwidthLM, "compile_blocks", broken_compile)
    with pytest.raises(ValueError, match="a bug in a block"):
        make_trainer(tmp_path / "run", compile="true").fit()


def test_auto_compiles_on_cuda_and_where_it_pays_for_the_run_on_a_cpu(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(step_setup, "_cxx_compiler", lambda: "/usr/bin/g++")
    assert should_compile("auto", cuda, 10) and should_compile("auto", cuda, 10, work=1.0)
    # A study's runs (they share the compile cache): by their length.
    assert not should_compile("auto", cpu, COMPILE_MIN_CPU_STEPS - 1)
    assert should_compile("auto", cpu, COMPILE_MIN_CPU_STEPS)
    # One run: by its work. fullband train's defaults (d_model 256, 4 layers, 1000 steps of 8 x 256 tokens) compile;
    # the same run at d_model 32 does not, nor the default model for 100 steps.
    default = compile_work(1000, 8 * 256, 256, 4, feedback=True)
    assert default >= COMPILE_MIN_CPU_WORK and should_compile("auto", cpu, 1000, default)
    assert not should_compile("auto", cpu, 1000, compile_work(1000, 8 * 256, 32, 4, feedback=True))
    assert not should_compile("auto", cpu, 100, compile_work(100, 8 * 256, 256, 4, feedback=True))
    assert should_compile("true", cpu, 1) and not should_compile("false", cuda, 10**6)
    monkeypatch.setattr(step_setup, "_cxx_compiler", lambda: None)
    assert not should_compile("auto", cpu, 10**6)  # no C++ compiler: inductor could not build CPU kernels


@pytest.mark.parametrize(("given", "want"), [(True, "true"), (False, "false"), ("yes", "true"), ("OFF", "false"),
                                             ("auto", "auto")])
def test_compile_takes_booleans_and_auto(given, want):
    assert TrainConfig(compile=given).compile == want


def test_a_bad_compile_value_says_what_to_use():
    with pytest.raises(ConfigError, match=r"compile='sometimes' is invalid: must be one of \('auto', 'true', "
                                          r"'false'\)"):
        TrainConfig(compile="sometimes")


def test_short_cpu_runs_stay_eager_by_default(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no compile attempt, no fallback warning
        trainer = make_trainer(tmp_path / "run")
    assert trainer.cfg.compile == "auto" and not trainer.compiled
