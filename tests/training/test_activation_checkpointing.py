"""train.activation_checkpointing: recomputing the blocks in backward trains to the same numbers as storing them
(under FSDP: tests/training/test_data_parallel.py, whose one spawn of two processes trains both)."""

import copy

import pytest
import torch
from conftest import make_model
from test_trainer import make_trainer, records

from fullband.config import ConfigError
from fullband.training.config import TrainConfig
from fullband.training.objective import MultiPassObjective


@pytest.mark.parametrize("grad_passes", [0, 1], ids=["every-pass", "truncated"])
def test_checkpointed_blocks_train_to_the_same_losses_and_weights(tmp_path, grad_passes):
    plain = make_trainer(tmp_path / "plain", compile="false", grad_passes=grad_passes)
    recomputed = make_trainer(tmp_path / "recomputed", compile="false", grad_passes=grad_passes,
                              activation_checkpointing=True)
    plain.fit()
    recomputed.fit()
    expected, got = records(tmp_path / "plain"), records(tmp_path / "recomputed")
    assert max(r["passes"] for r in expected) >= 2  # multi-pass feedback steps went through the checkpointed blocks
    for a, b in zip(expected, got, strict=True):
        assert a["passes"] == b["passes"]
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-6)
        assert b["pass_losses"] == pytest.approx(a["pass_losses"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    for a, b in zip(plain.raw_model.parameters(), recomputed.raw_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_one_multi_pass_backward_gives_the_same_gradients_and_saves_fewer_tensors():
    tokens = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(0))
    grads, saved = [], []
    for recompute in (False, True):
        model = make_model(seed=0, dtype=torch.float32)
        model.checkpoint_activations(recompute)
        count = [0]

        def pack(tensor, count=count):
            count[0] += 1
            return tensor

        torch.manual_seed(1)  # the same jitter
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = MultiPassObjective(jitter=0.02)(model, tokens, tokens, 3)
        out.loss.backward()
        grads.append([p.grad for p in model.parameters()])
        saved.append(count[0])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    assert saved[1] < saved[0]  # the blocks' inner activations were not kept for backward
    with torch.no_grad():  # evaluation and decoding run the blocks as they are
        assert torch.equal(model(tokens, passes=2).logits, make_model(seed=0, dtype=torch.float32)(tokens,
                                                                                                   passes=2).logits)


def test_the_option_takes_boolean_words_and_refuses_others():
    assert TrainConfig(activation_checkpointing=True).activation_checkpointing is True
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        TrainConfig(activation_checkpointing="maybe")


def test_a_retrofitted_model_checkpoints_through_transformers_and_keeps_its_gradients(tmp_path):
    from conftest import save_tiny_gpt2

    from fullband.integrations.retrofit import retrofit

    base = save_tiny_gpt2(tmp_path / "gpt2")
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    grads, saved = [], []
    for recompute in (False, True):
        torch.manual_seed(1)
        model = retrofit(copy.deepcopy(base), feedback_source="last_hidden").train()
        model.checkpoint_activations(recompute)
        count = [0]

        def pack(tensor, count=count):
            count[0] += 1
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = MultiPassObjective()(model, tokens, tokens, 2).loss
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        saved.append(count[0])
    assert saved[1] < saved[0]  # transformers recomputed its decoder layers
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
