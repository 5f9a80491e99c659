"""Continuous batching regroups rows of decoding caches through the caches' own ``gather_rows``: for the native
KVCache and a retrofitted model's cache it fills exactly the tensors the serve module's former gather (kept below
as the reference) wrote, and refuses what it cannot do."""

from __future__ import annotations

import pytest
import torch

from fullband import FullBandwidthLM, ModelConfig
from fullband.generation.decoding import decode_step, left_pad, prefill
from fullband.model import KVCache

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def reference_gather(model, rows, capacity):
    """serve/batching.gather_rows before the method existed (verbatim but for the names)."""
    lengths = [int(src.next_position[i]) for src, i in rows]
    L = max(lengths)
    cache = model.new_cache(len(rows), capacity)
    if isinstance(cache, KVCache):
        for new_row, ((src, i), n) in enumerate(zip(rows, lengths, strict=True)):
            cache.keys[:, new_row, :, L - n : L] = src.keys[:, i, :, src.length - n : src.length]
            cache.values[:, new_row, :, L - n : L] = src.values[:, i, :, src.length - n : src.length]
    else:
        for layer_index in range(len(cache.kv.layers)):
            first = rows[0][0].kv.layers[layer_index].keys
            keys = first.new_zeros(len(rows), first.shape[1], L, first.shape[3])
            values = torch.zeros_like(keys)
            for new_row, ((src, i), n) in enumerate(zip(rows, lengths, strict=True)):
                layer = src.kv.layers[layer_index]
                keys[new_row, :, L - n :] = layer.keys[i, :, src.length - n : src.length]
                values[new_row, :, L - n :] = layer.values[i, :, src.length - n : src.length]
            cache.kv.update(keys, values, layer_index)
    for new_row, n in enumerate(lengths):
        cache.valid[new_row, L - n : L] = True
    cache.next_position[:] = torch.tensor(lengths, device=cache.next_position.device)
    cache.length = L
    return cache


def native():
    torch.manual_seed(0)
    return FullBandwidthLM(ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                       max_seq_len=64, feedback=True)).double().eval()


def retrofitted():
    transformers = pytest.importorskip("transformers")
    import fullband

    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, vocab_size=61, bos_token_id=None, eos_token_id=None, pad_token_id=None))
    return fullband.retrofit(base.double().eval()).eval()


def layers_of(cache):
    if isinstance(cache, KVCache):
        return [(cache.keys[:, :, :, : cache.length], cache.values[:, :, :, : cache.length])]
    return [(layer.keys, layer.values) for layer in cache.kv.layers]


@pytest.mark.parametrize("make", [native, retrofitted], ids=["native", "retrofit"])
def test_gather_rows_writes_what_the_former_serve_gather_wrote(make):
    model = make()
    # Two batches of ragged prompts, prefilled in different modes, one decoded a step further.
    a = prefill(model, *left_pad([[5, 17, 3], [44, 8, 21, 9, 2]]), "soft", 12)
    b = prefill(model, *left_pad([[7], [30, 31]]), "fused:2", 12)
    decode_step(model, a, torch.tensor([1, 2]))
    rows = [(b.cache, 1), (a.cache, 0), (a.cache, 1), (b.cache, 0)]
    assert model.new_cache(1, 1).can_gather_rows()
    for capacity in (7, 20):
        expected = reference_gather(model, rows, capacity)
        got = model.new_cache(len(rows), capacity)
        got.gather_rows(rows)
        assert got.length == expected.length == 6
        assert torch.equal(got.valid, expected.valid) and torch.equal(got.next_position, expected.next_position)
        assert got.next_position.tolist() == [2, 4, 6, 1]
        for (k, v), (k_ref, v_ref) in zip(layers_of(got), layers_of(expected), strict=True):
            assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
        # and a step from the gathered cache is a step from the reference one
        carried = torch.stack([b.carried[1], a.carried[0], a.carried[1], b.carried[0]])
        logits = []
        for cache in (got, expected):
            out = model(torch.tensor([[3], [4], [5], [6]]), cache=cache, carried_state=carried,
                        attention_mask=torch.ones(4, 1, dtype=torch.long))
            logits.append(out.logits)
        assert torch.equal(*logits)


def test_gather_rows_fills_only_a_fresh_cache_of_as_many_rows():
    model = native()
    state = prefill(model, *left_pad([[5, 17, 3]]), "standard", 8)
    with pytest.raises(ValueError, match="fresh cache of 2 rows"):
        model.new_cache(3, 8).gather_rows([(state.cache, 0), (state.cache, 0)])
    with pytest.raises(ValueError, match="KV cache full"):
        model.new_cache(1, 2).gather_rows([(state.cache, 0)])
