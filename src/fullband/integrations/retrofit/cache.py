"""The decoding cache of a retrofitted model: a transformers DynamicCache plus the native KVCache's bookkeeping.

The shared decoding code (:mod:`fullband.generation`) and the exact evaluation hand a cache back to the model's
forward and never look inside, so this only has to offer what the retrofit forward needs, under the native
names, from :class:`~fullband.model.kv_cache.CacheSlots` (``length``, ``valid``, ``next_position``,
``check_room``, ``commit``).

Several passes over one chunk must each overwrite the chunk's keys/values, as the native cache does by writing
at fixed slots. A DynamicCache appends instead, so every pass first :meth:`rewind`\\ s the cache to the committed
length (cropping what the previous pass appended). That keeps chunked exact prefill on top of a filled cache
possible, which "run the passes without a cache, then one more pass to fill it" would not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PretrainedConfig

from fullband.integrations._hf_compat import crop_cache
from fullband.model.kv_cache import CacheSlots


class RetrofitCache(CacheSlots):
    def __init__(self, config: PretrainedConfig, batch_size: int, max_len: int, device: torch.device) -> None:
        super().__init__(batch_size, max_len, device)
        try:
            self.kv = DynamicCache(config=config)  # knows the model's layer types (sliding windows)
        except TypeError:  # pragma: no cover - releases whose DynamicCache takes no config
            self.kv = DynamicCache()

    def rewind(self, from_layer: int = 0) -> None:
        """Drop what an earlier pass over the pending chunk appended, so this pass takes its place: in every layer, or
        (a retrofit with a feedback target, whose pass re-runs the layers above it) in layers ``from_layer`` on."""
        if from_layer == 0:
            crop_cache(self.kv, self.length)
            return
        for layer in self.kv.layers[from_layer:]:
            extra = layer.get_seq_length() - self.length
            if extra > 0:
                layer.crop(-extra)  # a negative count removes that many (see crop_cache)

    def can_gather_rows(self) -> bool:
        """Only when every layer keeps every token: a sliding-window layer keeps a cropped window whose slots do not
        line up with ``valid``. By class name: a subclass of DynamicLayer (sliding window) does not count."""
        layers = getattr(self.kv, "layers", None)
        return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)

    def _copy_rows(self, rows: Sequence[tuple[CacheSlots, int]], lengths: list[int], L: int) -> None:
        # Per layer keys/values (B, H, S, hd) holding exactly the committed slots; an empty layer takes them whole.
        sources = []
        for src, _ in rows:
            if not isinstance(src, RetrofitCache):
                raise TypeError(f"a RetrofitCache gathers rows of RetrofitCaches, not of a {type(src).__name__}")
            sources.append(src)
        for layer_index in range(len(self.kv.layers)):
            first = sources[0].kv.layers[layer_index].keys
            keys = first.new_zeros(len(rows), first.shape[1], L, first.shape[3])
            values = torch.zeros_like(keys)
            for new_row, (src, (_, i), n) in enumerate(zip(sources, rows, lengths, strict=True)):
                layer = src.kv.layers[layer_index]
                keys[new_row, :, L - n :] = layer.keys[i, :, src.length - n : src.length]
                values[new_row, :, L - n :] = layer.values[i, :, src.length - n : src.length]
            self.kv.update(keys, values, layer_index)
