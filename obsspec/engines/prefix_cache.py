"""A block prefix cache for the hf engine's prefills: prompts that share a beginning compute it once.

A world model's prompts repeat themselves: every draft of an episode starts with the episode's
whole history so far (docs/ROLLOUT.md, "One turn"), and every episode of a GRPO group starts with
the same workspace snapshot and instruction. In one profile of a snapshot world model, prefill took
more of the drafts' time than decode (docs/WORLDMODEL.md); measured gains: docs/ENGINES.md. This cache keeps the keys and values of prompt *blocks* (`block`
tokens each) and reuses them for any later prompt that begins with the same tokens.

Prefill always runs block by block, cached or not, so a prompt's result never depends on what
happened to be cached: block i is computed from the same past keys and values, by the same
operations on tensors of the same shapes, whether blocks 0..i-1 came from the cache or were just
computed. Cold and warm prefills are bit-identical (tests/test_engines.py). The tokens after
the last whole block (at least one, so that there are logits to sample from) run fresh each time.

A block is found by (id of the block before it, its own tokens): an exact key, no hashing. The
least recently used blocks go first once more than `max_tokens` tokens are held; a block whose
parent was dropped is never found again and ages out in turn. Keys and values depend on the
weights, so the engine clears the cache whenever an adapter is loaded or unloaded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache


class PrefixCache:
    def __init__(self, block: int, max_tokens: int):
        if block < 1 or max_tokens < block:
            raise ValueError(f"a prefix cache needs block >= 1 and max_tokens >= block "
                             f"(got block={block}, max_tokens={max_tokens})")
        self.block = block
        self.max_blocks = max_tokens // block
        # (adapter, parent block id, block tokens) -> (block id, per-layer (keys, values))
        self._blocks: OrderedDict[tuple, tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]] = OrderedDict()
        self._next_id = 1
        self.hit_tokens = 0  # prompt tokens whose keys and values came from the cache
        self.computed_tokens = 0  # prompt tokens run through the model

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()

    def prefill(self, model: Any, ids: Sequence[int], adapter: str | None,
                device: torch.device) -> tuple[torch.Tensor, DynamicCache]:
        """Last-position logits and the KV cache of prompt `ids`, run block by block; whole
        blocks come from the cache where an earlier prompt had them."""
        cache = DynamicCache(config=model.config)
        whole = (len(ids) - 1) // self.block  # the last token always runs fresh
        parent, found = 0, []
        for i in range(whole):
            key = (adapter, parent, tuple(ids[i * self.block:(i + 1) * self.block]))
            entry = self._blocks.get(key)
            if entry is None:
                break
            self._blocks.move_to_end(key)
            parent = entry[0]
            found.append(entry[1])
        reused = len(found)
        for layer in range(len(cache.layers) if found else 0):
            cache.update(torch.cat([kv[layer][0] for kv in found], dim=-2),
                         torch.cat([kv[layer][1] for kv in found], dim=-2), layer)
        for i in range(reused, whole):
            start = i * self.block
            self._forward(model, ids[start:start + self.block], cache, device)
            entry = (self._next_id, [(layer.keys[..., start:, :].clone(), layer.values[..., start:, :].clone())
                                     for layer in cache.layers])
            self._next_id += 1
            self._blocks[(adapter, parent, tuple(ids[start:start + self.block]))] = entry
            parent = entry[0]
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        self.hit_tokens += reused * self.block
        self.computed_tokens += len(ids) - reused * self.block
        logits = self._forward(model, ids[whole * self.block:], cache, device)
        return logits, cache

    @staticmethod
    def _forward(model: Any, ids: Sequence[int], cache: DynamicCache, device: torch.device) -> torch.Tensor:
        out = model(input_ids=torch.tensor([list(ids)], device=device), past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]
