"""Test doubles for the code around engines: a byte tokenizer and a scripted policy engine.

The scripted policy is a pure function of (prompt token ids, seed): any change to the context it
is given changes what it does, so a scheduler that let a wrong observation through would produce
a different trajectory — which is exactly what the losslessness tests must be able to catch.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from obsspec import chat
from obsspec.engines.base import Generation, GenerationRequest

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; special tokens follow."""

    def __init__(self):
        self.special = {s: 256 + i for i, s in enumerate(SPECIALS)}
        self.inverse = {v: k for k, v in self.special.items()}
        self._split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in self._split.split(text):
            if piece in self.special:
                ids.append(self.special[piece])
            elif piece:
                ids += list(piece.encode("utf-8", "surrogatepass"))
        return ids

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i in self.inverse:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(self.inverse[i])
            else:
                buf.append(i)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


class ScriptedPolicy:
    """An engine whose action is a deterministic function of (prompt ids, seed).

    It picks a command from `commands` (or `done()` after `done_after` tool results), writes it as
    a tool call, ends with <|im_end|>, and takes `token_delay` seconds per token, so that
    speculative generations can be in flight, finished or cancelled at any point.
    """

    def __init__(self, tokenizer, commands, token_delay=0.0005, done_after=4):
        self.tok, self.commands, self.token_delay, self.done_after = tokenizer, commands, token_delay, done_after
        self.im_end = tokenizer.special["<|im_end|>"]
        self.requests: list[GenerationRequest] = []
        self.cancelled: set[str] = set()
        self.steps: dict[str, int] = {}

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        prompt = tuple(request.prompt_ids)
        text = self.tok.decode(prompt)
        h = _h(prompt, request.seed)
        if text.count("<tool_response>") >= self.done_after:
            action = chat.render_done()
        else:
            action = chat.render_bash(self.commands[h % len(self.commands)].format(h=h % 1000))
        ids = self.tok.encode(action) + [self.im_end]
        ids = ids[: request.max_new_tokens]
        out = []
        for i, t in enumerate(ids):
            if request.request_id in self.cancelled:
                return self._gen(request, out, "cancelled", h)
            out.append(t)
            self.steps[request.request_id] = i + 1
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        reason = "stop" if out and out[-1] == self.im_end else "length"
        return self._gen(request, out, reason, h)

    def _gen(self, request, out, reason, h) -> Generation:
        logprobs = tuple(-((h >> (i % 48)) % 1000) / 1000.0 for i in range(len(out)))
        return Generation(request.request_id, tuple(out), logprobs, reason)

    def cancel(self, request_id: str) -> bool:
        self.cancelled.add(request_id)
        return True
