"""``fullband compare --data.source DIR`` on prepared shards: trained on them, scored on their validation split."""

import json

import pytest
import torch

from fullband.cli import main
from fullband.data import eval_windows, load_prepared, load_tokenizer
from fullband.data.config import PrepareConfig
from fullband.data.errors import DataError
from fullband.data.prepare import prepare_shards
from fullband.data.prepared import load_flat_split
from fullband.experiments.core.lm.perplexity import evaluate_modes
from fullband.families import load_any

TEXT = "".join(f"Line {i}: to be or not to be, that is question number {i}.\n" for i in range(400))


def prepare(tmp_path, val_fraction=0.25):
    (tmp_path / "corpus.txt").write_text(TEXT)
    out = tmp_path / f"shards-{val_fraction}"
    prepare_shards(PrepareConfig(input=str(tmp_path / "corpus.txt"), out_dir=str(out), chunk_bytes=2000,
                                 shard_tokens=2000, val_fraction=val_fraction, workers=1, progress=False))
    return out


def test_compare_trains_on_shards_and_scores_their_validation_split(tmp_path):
    shards, out = prepare(tmp_path), tmp_path / "cmp"
    assert len(load_prepared(shards, "validation").tokens) > 1  # the scored split spans several shard files
    assert main(["compare", "--preset", "smoke", "--data.source", str(shards), "--out_dir", str(out),
                 "--stability_passes", "3", "--stability_ablation", "false", "--threads", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    runs = {r["name"]: r for r in results["runs"]}
    assert {r["scored_split"] for r in runs.values()} == {"validation"}
    assert "Validation split: 8 windows" in (out / "report.md").read_text()
    run_dir = out / "seed0" / "feedback"
    assert f'source = "{shards}"' in (run_dir / "config.toml").read_text()  # the run trained on the shards
    # The score is the model's loss on the shards' validation windows, as evaluate_modes computes it directly.
    model = load_any(run_dir / "model").eval()
    val = load_flat_split(shards, "validation", load_tokenizer(run_dir / "model"))
    assert val.n_tokens == sum(len(t) for t in load_prepared(shards, "validation").tokens)
    direct = evaluate_modes(model, list(eval_windows(val.tokens, 32, 8, 8)), val, (1, 2, 4))
    assert runs["feedback"]["test"]["standard"]["loss"] == pytest.approx(direct["standard"].loss, rel=1e-6)
    assert runs["feedback"]["test"]["fused1"]["loss"] == pytest.approx(direct["fused1"].loss, rel=1e-6)
    assert torch.isfinite(torch.tensor(runs["baseline-1x"]["test"]["standard"]["loss"]))


def test_shards_without_a_validation_split_cannot_be_scored(tmp_path):
    shards = prepare(tmp_path, val_fraction=0.0)
    tokenizer = load_tokenizer(shards / "tokenizer")
    with pytest.raises(DataError, match="val_fraction"):
        load_flat_split(shards, "validation", tokenizer)
