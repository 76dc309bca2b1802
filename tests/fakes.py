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
from obsspec.engines.base import Generation, GenerationRequest, SchedulingStats

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; special tokens follow."""

    def __init__(self):
        self.special = {s: 256 + i for i, s in enumerate(SPECIALS)}
        self.inverse = {v: k for k, v in self.special.items()}
        self._split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in self._split.split(text):
            if piece in self.special and not split_special_tokens:
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


class PlainEngine:
    """What a fake engine that never re-prioritises and measures nothing inherits (cancelling
    its task is the only way to stop one of its requests)."""

    def cancel(self, request_id: str) -> bool:
        return False

    def promote(self, request_id: str) -> bool:
        return False

    def scheduling_stats(self) -> SchedulingStats:
        return SchedulingStats(measured=False)


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
        self.promoted: list[str] = []
        self.steps: dict[str, int] = {}
        self.promoted: list[str] = []

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

    def promote(self, request_id: str) -> bool:
        self.promoted.append(request_id)  # recorded; every request runs at full speed anyway
        return False

    def scheduling_stats(self) -> SchedulingStats:
        return SchedulingStats(measured=False)


class VLLMProtocolServer:
    """A local HTTP server that answers the subset of vLLM's OpenAI-compatible API obsspec's
    `VLLMEngine` speaks (/v1/completions with token ids, /v1/load_lora_adapter,
    /v1/unload_lora_adapter) by running a real `HFEngine`: a stand-in for a vLLM server on a
    machine without a GPU. `calls` records (path, model or adapter name) in arrival order and
    `priorities` the priority of each completion. A non-zero `priority` is refused with vLLM's
    400 unless `priority_scheduling` (vLLM's `--scheduling-policy priority`) is on.

        with VLLMProtocolServer(hf_engine, "policy") as server:
            VLLMEngine(server.url, "policy")
    """

    def __init__(self, engine, model_name: str, priority_scheduling: bool = False, max_model_len: int = 2048):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.engine, self.model_name, self.calls = engine, model_name, []
        self.priority_scheduling, self.priorities = priority_scheduling, []
        self.max_model_len = max_model_len
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.do_POST()

            def do_POST(self):
                import json

                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                status, reply = outer.answer(self.path, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.loaded: dict[str, str] = {}  # adapter name -> the folder it was loaded from

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        import os

        if path == "/v1/models":  # vLLM's listing: the base model, then each adapter
            with self.lock:
                loaded = dict(self.loaded)
            return 200, {"object": "list", "data": [
                {"id": self.model_name, "root": self.model_name, "parent": None, "max_model_len": self.max_model_len},
                *({"id": n, "root": p, "parent": self.model_name} for n, p in loaded.items())]}
        if path == "/v1/load_lora_adapter":
            name, folder = body["lora_name"], body["lora_path"]
            if name in self.loaded and not body.get("load_inplace"):  # vLLM 0.32's answer
                return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded. If you "
                                                  "want to load the adapter in place, set 'load_inplace' to True.",
                                       "type": "InvalidUserInput", "code": 400}}
            if not os.path.isabs(folder):  # the real server resolves it in its own working directory
                return 404, {"error": {"message": f"Loading lora {name} failed: No adapter found for {folder}",
                                       "type": "NotFoundError", "code": 404}}
            asyncio.run(self.engine.load_adapter(name, folder))
            with self.lock:
                self.calls.append((path, name))
                self.loaded[name] = folder
            return 200, {}
        if path == "/v1/unload_lora_adapter":
            if body["lora_name"] not in self.loaded:
                return 404, {"error": {"message": f"The lora adapter '{body['lora_name']}' cannot be found.",
                                       "type": "NotFoundError", "code": 404}}
            asyncio.run(self.engine.unload_adapter(body["lora_name"]))
            with self.lock:
                self.calls.append((path, body["lora_name"]))
                self.loaded.pop(body["lora_name"], None)
            return 200, {}
        model = body["model"]
        with self.lock:
            self.calls.append((path, model))
            known = model == self.model_name or model in self.loaded
        if not known:
            return 404, {"error": {"message": f"The model `{model}` does not exist. Valid aliases: "
                                              f"{self.model_name}.", "type": "NotFoundError", "code": 404}}
        n = len(body["prompt"])  # vLLM 0.32: past the limit 400, at it 400, else max_tokens cut to fit
        if body["max_tokens"] > self.max_model_len:
            return 400, {"error": {"message": f"max_tokens={body['max_tokens']} cannot be greater than "
                                              f"max_model_len={self.max_model_len}. Please request fewer "
                                              "output tokens.", "type": "BadRequestError", "code": 400}}
        if n > self.max_model_len:
            return 400, {"error": {"message": f"This model's maximum context length is {self.max_model_len} "
                                              f"tokens. However, your prompt contains at least {n} input tokens",
                                   "type": "BadRequestError", "code": 400}}
        max_tokens = min(body["max_tokens"], self.max_model_len - n)
        if max_tokens < 1:
            return 400, {"error": {"message": f"max_tokens must be at least 1, got {max_tokens}.",
                                   "type": "BadRequestError", "code": 400}}
        priority = body.get("priority", 0)
        with self.lock:
            self.priorities.append(priority)
        if priority != 0 and not self.priority_scheduling:  # vLLM's check and wording
            return 400, {"error": {"message": f"Got priority {priority} but Priority scheduling "
                                              "is not enabled.", "type": "BadRequestError"}}
        gen = asyncio.run(self.engine.generate(GenerationRequest(
            tuple(body["prompt"]), max_new_tokens=max_tokens, temperature=body["temperature"],
            top_p=body["top_p"], seed=body["seed"], stop_token_ids=tuple(body["stop_token_ids"]),
            adapter=None if model == self.model_name else model, priority=priority)))
        reason = {"stop": "stop", "length": "length", "cancelled": "abort"}[gen.finish_reason]
        choice = {"index": 0, "token_ids": list(gen.token_ids), "finish_reason": reason,
                  "stop_reason": gen.stop_reason, "logprobs": {"token_logprobs": list(gen.logprobs)}}
        return 200, {"id": "cmpl", "object": "text_completion", "model": model, "choices": [choice]}

    def __enter__(self) -> "VLLMProtocolServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
