"""The lm-eval adapter: loglikelihood in every mode equals a direct computation with the model; rolling
loglikelihood, generate_until, and a 5-shot local task end to end (offline) through ``fullband eval``."""

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # set before datasets is imported: it reads them once
os.environ["HF_HUB_OFFLINE"] = "1"

import json

import pytest
import torch
from conftest import make_model
from lm_eval.api.instance import Instance

from fullband import FullBandwidthLM
from fullband.cli import main
from fullband.data import ByteTokenizer
from fullband.evaluation.adapter import FullbandLM
from fullband.evaluation.continuation import score_continuations
from fullband.generation import generate
from fullband.generation.decoding import decode_step, left_pad, prefill

MODES = ("standard", "soft", "fused:2", "exact")
PAIRS = [("2+3=", "5"), ("The cat", " sat on"), ("", "hello"), ("ab ", "cd"), ("x" * 20, "yz")]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    model = make_model(vocab_size=320, max_seq_len=48)
    with torch.no_grad():  # a strong state path, so the modes give clearly different numbers
        model.fusion.state_proj.weight.mul_(20)
    model.save_pretrained(path)
    ByteTokenizer().save(path)
    return path


def adapter(checkpoint, mode, **kwargs) -> FullbandLM:
    return FullbandLM(str(checkpoint), mode=mode, dtype="float64", progress=False, **kwargs)


def requests(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def direct(model, mode, context, continuation):
    """log p(continuation | context) from the model's own forwards (no adapter code).

    The model reads context + continuation[:-1] (the last token is only scored), as the adapter does."""
    inputs = torch.tensor([context + continuation[:-1]])
    n = len(context)
    if mode == "standard":
        logits = model(inputs).logits
    elif mode == "soft":  # context plain, everything after it fully recurrent
        logits = model.forward_exact(inputs, plain_prefix=n).logits
    elif mode == "exact":
        logits = model.forward_exact(inputs, plain_prefix=1).logits
    else:  # fused:2: teacher-forced fused decoding, one token at a time
        ids, mask = left_pad([context])
        state = prefill(model, ids, mask, "fused:2", inputs.shape[1])
        total = 0.0
        for i, token in enumerate(continuation):
            total += torch.log_softmax(state.next_logits[0], -1)[token].item()
            if i < len(continuation) - 1:
                decode_step(model, state, torch.tensor([token]))
        return total
    logprobs = torch.log_softmax(logits[0, n - 1 :], -1)
    return logprobs.gather(1, torch.tensor(continuation)[:, None]).sum().item()


@pytest.mark.parametrize("mode", MODES)
def test_loglikelihood_equals_a_direct_computation(checkpoint, mode):
    lm = adapter(checkpoint, mode, batch_size=3)
    got = lm.loglikelihood(requests("loglikelihood", PAIRS))
    tok = ByteTokenizer()
    for (context, continuation), (logprob, _) in zip(PAIRS, got, strict=True):
        if context.endswith(" "):  # the trailing space moves to the continuation
            context, continuation = context.rstrip(), " " + continuation
        context_ids = tok.encode(context) or [tok.eos_id]
        assert logprob == pytest.approx(direct(lm.model, mode, context_ids, tok.encode(continuation)), abs=1e-9)


def test_modes_differ_and_fused_with_enough_passes_is_exact(checkpoint):
    context, continuation = [5, 9, 77, 3, 120], [40, 41, 42]
    model = adapter(checkpoint, "standard").model
    scores = {m: score_continuations(model, [(context, continuation)], m)[0][0] for m in MODES}
    assert len({round(v, 6) for v in scores.values()}) == 4
    # len(context) - 1 extra passes make every context position exact (DESIGN.md §2).
    converged = score_continuations(model, [(context, continuation)], f"fused:{len(context) - 1}")
    assert converged[0][0] == pytest.approx(scores["exact"], abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_greedy_flag_matches_greedy_decoding(checkpoint, mode):
    model = adapter(checkpoint, mode).model
    prompts = [[7, 8, 9], [100, 3, 4, 5, 6, 7], [42]]
    generated = generate(model, prompts, max_new_tokens=5, mode=mode)
    pairs = [(p, g[len(p) :]) for p, g in zip(prompts, generated, strict=True)]
    assert all(greedy for _, greedy in score_continuations(model, pairs, mode))
    changed = [(p, [*x[:-1], (x[-1] + 1) % 320]) for p, x in pairs]
    assert not any(greedy for _, greedy in score_continuations(model, changed, mode))


def test_batched_scores_equal_one_by_one_and_keep_the_request_order(checkpoint):
    batched = adapter(checkpoint, "soft", batch_size=4).loglikelihood(requests("loglikelihood", PAIRS))
    single = adapter(checkpoint, "soft", batch_size=1).loglikelihood(requests("loglikelihood", PAIRS))
    assert [b[0] for b in batched] == pytest.approx([s[0] for s in single], abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_loglikelihood_rolling_scores_every_token_once(checkpoint, mode):
    lm = adapter(checkpoint, mode)
    short = "Hello world"
    doc = "".join(chr(33 + (7 * i) % 94) for i in range(100))  # 100 byte tokens, no repeating period < 94
    rolled = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(short,), (doc,)]))
    eos, ids = ByteTokenizer.eos_id, ByteTokenizer().encode(doc)
    assert len(ids) == 100
    # One window: context = end-of-text, continuation = the document.
    assert rolled[0] == pytest.approx(direct(lm.model, mode, [eos], list(short.encode())), abs=1e-9)
    # max_seq_len = 48: lm-eval's disjoint windows predict tokens 0..47 (after end-of-text), 48..95 (after token
    # 47) and 96..99 (after as many earlier tokens as fit), each token exactly once.
    windows = [([eos], ids[:48]), (ids[47:48], ids[48:96]), (ids[51:96], ids[96:])]
    assert [t for _, continuation in windows for t in continuation] == ids
    expected = sum(direct(lm.model, mode, context, continuation) for context, continuation in windows)
    assert rolled[1] == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("mode", ["soft", "exact"])
def test_generate_until_decodes_in_the_mode_and_cuts_at_the_stop_string(checkpoint, mode):
    lm = adapter(checkpoint, mode, batch_size=2)
    prompts = ["12+7=", "abc", "The answer is"]
    model, tok = lm.model, ByteTokenizer()
    full = []
    for p in prompts:
        ids = generate(model, tok.encode(p), max_new_tokens=10, mode=mode,
                       stop_token_ids=[tok.eos_id])
        full.append(tok.decode(ids[len(p) :]))
    # Stop at the first character of the first output that is a real character (random bytes decode partly to
    # U+FFFD, which a stream decoder and a whole-text decoder place differently) and not at its start.
    cut = next((i for i, ch in enumerate(full[0]) if i > 0 and ch != "\ufffd" and ch not in full[0][:i]), None)
    assert cut is not None, full[0]
    stop = full[0][cut]
    outs = lm.generate_until(requests("generate_until", [(p, {"until": [stop], "max_gen_toks": 10}) for p in prompts]))
    assert outs == [text[: text.index(stop)] if stop in text else text for text in full]
    assert len(outs[0]) == cut


TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    train: {data}/train.jsonl
    test: {data}/test.jsonl
output_type: {output_type}
training_split: train
test_split: test
fewshot_split: train
doc_to_text: "{{{{question}}}}="
target_delimiter: ""
fewshot_delimiter: "\\n"
"""
MC = 'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n'
GEN = ('doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\n  do_sample: false\n'
       "metric_list:\n  - metric: exact_match\n")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    data = root / "data"
    data.mkdir()
    for split, offset, n in (("train", 0, 8), ("test", 50, 4)):
        rows = []
        for i in range(offset, offset + n):
            a, b = i % 7, i % 5
            choices = [str(a + b), str(a + b + 1), str(a * b + 10)]
            rows.append({"question": f"{a}+{b}", "choices": choices, "label": 0, "answer": str(a + b)})
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = root / "yaml"
    tasks.mkdir()
    (tasks / "mc.yaml").write_text(TASK.format(name="fb_add_mc", data=data, output_type="multiple_choice") + MC)
    (tasks / "gen.yaml").write_text(TASK.format(name="fb_add_gen", data=data, output_type="generate_until") + GEN)
    return tasks


def test_eval_lm_runs_a_local_5_shot_task_offline(checkpoint, task_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["eval", "--checkpoint", str(checkpoint), "--tasks", "fb_add_mc,fb_add_gen", "--num-fewshot", "5",
                 "--include_path", str(task_dir), "--include_defaults", "false", "--decode.mode", "soft",
                 "--log_samples", "true", "--out_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fb_add_mc" in printed and "exact_match" in printed and "|acc" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["n-shot"] == {"fb_add_mc": 5, "fb_add_gen": 5}
    assert results["fullband"]["decode"]["mode"] == "soft"  # the config as run: its [decode] section
    samples = json.loads((out / "samples.json").read_text())
    context = samples["fb_add_mc"][0]["arguments"][0][0]
    assert context.count("=") == 6  # five solved examples, then the question
    # acc from scratch: each choice's log-likelihood computed directly (soft mode), the best one against the label.
    model, tok = FullBandwidthLM.from_pretrained(checkpoint), ByteTokenizer()
    correct = []
    for sample in samples["fb_add_mc"]:
        scores = [direct(model, "soft", tok.encode(c), tok.encode(x)) for c, x in sample["arguments"]]
        assert [r[0] for r in sample["filtered_resps"]] == pytest.approx(scores, abs=1e-4)  # run in float32
        correct.append(max(range(len(scores)), key=scores.__getitem__) == sample["target"])
    assert len(correct) == 4 and results["results"]["fb_add_mc"]["acc,none"] == sum(correct) / len(correct)


def test_simple_evaluate_finds_the_registered_model_by_name(checkpoint, task_dir):
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="fullband", model_args=f"pretrained={checkpoint},mode=fused:2,progress=False",
        tasks=["fb_add_mc"], num_fewshot=5, batch_size=4,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
    )
    assert results["config"]["model"] == "fullband" and "acc,none" in results["results"]["fb_add_mc"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "nope", "--include_defaults", "false"], "unknown task(s) ['nope']"),
        (["--tasks", "x", "--decode.mode", "fast"], "mode='fast' is invalid"),
        (["--tasks", ""], "tasks=() is invalid"),
    ],
)
def test_eval_lm_errors_are_one_clear_line(checkpoint, capsys, argv, message):
    assert main(["eval", "--checkpoint", str(checkpoint), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_bare_fused_and_the_retired_prefill_passes_are_refused_naming_fused_k(checkpoint):
    from fullband.config import ConfigError

    with pytest.raises(ConfigError, match=r"^prefill_passes=2 is retired: .*mode=fused:K"):
        FullbandLM(str(checkpoint), mode="fused", prefill_passes=2)  # model_args=...,mode=fused,prefill_passes=2
    with pytest.raises(ConfigError, match="write fused:K"):
        FullbandLM(str(checkpoint), mode="fused")
