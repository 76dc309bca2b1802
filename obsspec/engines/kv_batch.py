"""The arithmetic under the hf engine: sampling one token, and decoding many requests in one
left-padded batch whose KV cache rows join and leave between steps.

Why left padding: every row's newest token sits in the last column, so one forward pass with an
attention mask (0 = padding) and explicit per-row position ids decodes all rows. Rotary position
embeddings are applied before keys enter the cache, so shifting a row's cache to the right when a
longer row joins changes nothing for that row except the padding it must ignore. Measured on CPU
with tiny Qwen3s: a padded batch moves a request's logprobs by up to ~1e-6 against the same
request alone; the hf engine's batch-invariant mode avoids even that by never sharing a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[int, float]:
    """Pick the next token from one row of logits; return it with its logprob.

    The logprob is log_softmax(logits / temperature) over the full vocabulary (raw logits for
    greedy); top-p only narrows what can be drawn. See obsspec/engines/base.py.
    """
    logits = logits.float()
    if temperature == 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    probs = logprobs.exp()
    if top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p; the most likely token always stays.
        outside = sorted_probs.cumsum(0) - sorted_probs >= top_p
        probs = probs.scatter(0, order[outside], 0.0)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])


def propose(context: Sequence[int], max_tokens: int, ngram: int = 3) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the context's
    last `n` tokens (n = `ngram` down to 1), at most `max_tokens`; [] when there is none. A
    world model copying a listing from its workspace snapshot writes a span of its own prompt,
    which one verifying pass then accepts many tokens of at a time."""
    end = len(context)
    for n in range(min(ngram, end - 1), 0, -1):
        tail = list(context[end - n:])
        for start in range(end - n - 1, -1, -1):
            if context[start + n - 1] == tail[-1] and list(context[start:start + n]) == tail:
                return list(context[start + n:start + n + max_tokens])
    return []


def pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Zero-pad `t` at the start of dimension `dim` (a non-negative index) up to `length`."""
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - (dim % t.dim())) + [missing, 0]
    return F.pad(t, pad)


class DecodeBatch:
    """Running requests that share one adapter, one priority class and one left-padded KV cache.

    A row is any object with `tokens` (the tokens sampled so far; the last one is fed next) and
    `position` (the position id that token is fed at).
    """

    def __init__(self, adapter: str | None, priority: int = 0):
        self.adapter = adapter
        self.priority = priority  # 0: committed rows; > 0: speculative rows (the engine pauses them)
        self.rows: list[Any] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, cache length); 0 marks left padding

    def add(self, row: Any, cache: DynamicCache, mask: torch.Tensor | None = None) -> None:
        """Join a row with its own cache (batch size 1) and, for one taken from another batch,
        its mask (1, cache length); by default every cached column counts."""
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            raise NotImplementedError(
                "batched decoding needs a full-attention cache (DynamicLayer); "
                "construct HFEngine(..., batch_invariant=True) for this model"
            )
        n = cache.get_seq_length()
        if mask is None:
            mask = torch.ones(1, n, dtype=torch.long, device=cache.layers[0].keys.device)
        if not self.rows:
            self.rows, self.cache, self.mask = [row], cache, mask
            return
        length = max(self.mask.shape[1], n)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([pad_left(mine.keys, length, 2),
                                   pad_left(theirs.keys, length, 2)])
            mine.values = torch.cat([pad_left(mine.values, length, 2),
                                     pad_left(theirs.values, length, 2)])
        self.mask = torch.cat([pad_left(self.mask, length, 1), pad_left(mask, length, 1)])
        self.rows.append(row)

    def forward(self, model: Any) -> torch.Tensor:
        """One decode step: feed each row's last sampled token; return next-token logits."""
        return self.forward_proposed(model, [[] for _ in self.rows])[:, -1, :]

    def forward_proposed(self, model: Any, proposals: list[list[int]]) -> torch.Tensor:
        """One verifying step: feed each row's last sampled token followed by its proposed
        tokens (rows padded to the longest proposal; the padding is masked out); return the
        logits after every fed column, (rows, 1 + longest proposal, vocabulary). Columns a row
        does not keep are masked out afterwards with `unfeed`: a hole in the mask is ignored
        exactly like left padding, and position ids stay explicit, so the row goes on as if
        only its kept tokens had been fed."""
        device = self.mask.device
        width = 1 + max(len(p) for p in proposals)
        ids = torch.tensor([[r.tokens[-1], *p] + [0] * (width - 1 - len(p))
                            for r, p in zip(self.rows, proposals)], device=device)
        positions = torch.tensor([[r.position + j for j in range(width)] for r in self.rows], device=device)
        new = torch.tensor([[1] * (1 + len(p)) + [0] * (width - 1 - len(p)) for p in proposals],
                           dtype=self.mask.dtype, device=device)
        self.mask = torch.cat([self.mask, new], dim=1)
        out = model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits

    def unfeed(self, row: int, columns: int) -> None:
        """The last `columns` fed columns of `row` never happened (rejected proposals)."""
        if columns > 0:
            self.mask[row, -columns:] = 0

    def keep(self, indices: list[int]) -> None:
        if len(indices) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in indices]
        if not indices:
            self.cache = self.mask = None
            return
        idx = torch.tensor(indices, device=self.mask.device)
        mask = self.mask[idx]
        # Columns that are padding in every remaining row cost compute and change nothing.
        start = int((mask.sum(0) > 0).nonzero()[0])
        self.mask = mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]

    def take(self, index: int) -> tuple[Any, DynamicCache, torch.Tensor]:
        """Remove row `index` and return it with a cache and mask of its own, its left padding
        stripped, ready to `add` to another batch. Its keys and values are copied unchanged,
        so it continues as it would have here (up to the float noise of other padding)."""
        row_mask = self.mask[index]
        start = int(row_mask.nonzero()[0])
        cache = DynamicCache([(layer.keys[index:index + 1, :, start:],
                               layer.values[index:index + 1, :, start:]) for layer in self.cache.layers])
        mask = row_mask[start:].unsqueeze(0).clone()
        row = self.rows[index]
        self.keep([i for i in range(len(self.rows)) if i != index])
        return row, cache, mask
