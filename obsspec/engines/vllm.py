"""Engine that talks to a vLLM OpenAI-compatible server with token-id prompts.

vLLM pins its own torch and transformers, so it runs as a server from its own virtualenv and this
process only speaks HTTP (stdlib asyncio streams; no vllm import, no extra dependency). The
server is started with the flags obsspec needs by `obsspec serve RECIPE` (obsspec/engines/server.py):

    engine = VLLMEngine("http://127.0.0.1:8001", model="Qwen/Qwen3-0.6B")
    engine.check_model()   # one line naming both names unless the server serves exactly that one

Mapping (details and the vLLM API assumptions in docs/ENGINES.md):
- `generate` POSTs /v1/completions with `prompt` = the token ids, `seed`, `stop_token_ids`,
  `stop`, `ignore_eos` (only our stop tokens end a generation, as in the hf engine),
  `logprobs=0` (the sampled token's logprob) and `return_token_ids`; the reply's `token_ids` and
  `logprobs.token_logprobs` become the `Generation`.
- A request naming an adapter sends that adapter's name as `model`; `load_adapter` POSTs
  /v1/load_lora_adapter in place (also over a name an earlier client loaded), with the folder
  absolute, and checks that /v1/models lists it from that folder. Use a new name per version.
- Cancelling the awaiting task closes the connection; vLLM's completion endpoint aborts a request
  whose client disconnected, which frees its slot in the batch.
- With `priority_scheduling=True` the request's `priority` is sent too (the server must run with
  `--scheduling-policy priority`; lower is served first, as ours). A request running on the server
  cannot be re-prioritised (`promote` is False) and the client sees no scheduling inside it
  (`scheduling_stats().measured` is False).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from obsspec.engines.base import (
    EngineClosedError,
    NotServed,
    Generation,
    GenerationRequest,
    PromptTooLong,
    SchedulingStats,
)

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


# vLLM's 400 for a prompt that leaves no room for a token within max_model_len, in the wordings
# of its versions (0.32: a prompt past it is "maximum context length"; one exactly at it leaves
# max_tokens 0, "max_tokens must be at least 1"). The client cuts max_tokens to the room the
# server's max_model_len leaves (vLLM 0.32 refuses max_tokens > max_model_len outright, and a
# world model's draft budget can be larger), so a generation that runs out of room ends as
# "length", as on the hf engine. Any other 400 is an error, never a silent "no draft".
_TOO_LONG = re.compile(r"maximum context length|longer than the maximum model length|"
                       r"max_tokens must be at least 1", re.I)


class VLLMServerError(RuntimeError):
    """The server answered with an error status (the message is the server's)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"vLLM server answered {status}: {message}")
        self.status = status


class AdapterNotServed(VLLMServerError, NotServed):
    """404: the model or adapter named is not served (an adapter version unloaded meanwhile)."""


class VLLMEngine:
    """A client engine for one vLLM server; `model` is the served base model's name."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_sec: float | None = None, priority_scheduling: bool = False):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
        self.base_url = base_url
        self.model = model
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/").removesuffix("/v1")  # accept .../v1 as well
        self._api_key = api_key
        self._timeout = timeout_sec
        # vLLM refuses a non-zero priority unless served with --scheduling-policy priority
        self.priority_scheduling = priority_scheduling
        self._inflight: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self._cancelled: set[str] = set()
        self._closed = False
        self.max_model_len: int | None = None  # the server's, learnt from /v1/models (None: it gives none)
        self._limit_read = False               # (asked once, not before every request)

    # ---- generation --------------------------------------------------------------------------

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The /v1/completions body for a request (`max_tokens` cut to the room `max_model_len`
        leaves, when known)."""
        max_tokens = request.max_new_tokens
        if self.max_model_len is not None:
            room = self.max_model_len - len(request.prompt_ids)
            if room < 1:
                raise PromptTooLong(f"a prompt of {len(request.prompt_ids)} tokens leaves no room within "
                                    f"the server's max_model_len ({self.max_model_len})")
            max_tokens = min(max_tokens, room)
        body = {
            "model": request.adapter or self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "seed": request.seed,
            "stop_token_ids": list(request.stop_token_ids),
            "stop": list(request.stop_strings),
            "include_stop_str_in_output": True,
            "ignore_eos": True,
            "skip_special_tokens": False,
            "logprobs": 0,
            "return_token_ids": True,
            # Older servers lack return_token_ids; with this flag the logprob entries carry the
            # token ids as "token_id:N" strings, which `parse` falls back to.
            "return_tokens_as_token_ids": True,
            "request_id": request.request_id,
        }
        if self.priority_scheduling:
            body["priority"] = request.priority
        return body

    async def generate(self, request: GenerationRequest) -> Generation:
        if self._closed:
            raise EngineClosedError("the engine is closed")
        rid = request.request_id
        if rid in self._inflight:
            raise ValueError(f"request id {rid!r} is already running")
        start = time.perf_counter()
        if not self._limit_read:
            self.max_model_len, self._limit_read = _limit(self.model, await self.served_models()), True
        call = asyncio.ensure_future(self._request("POST", "/v1/completions", self.payload(request)))
        self._inflight[rid] = call
        try:
            reply = await call
        except asyncio.CancelledError:
            if self._closed:
                raise EngineClosedError("the engine was closed") from None
            if rid in self._cancelled and not _being_cancelled():
                # engine.cancel(): the server aborted it; tokens made so far are not reported.
                return Generation(rid, (), (), "cancelled", compute_sec=time.perf_counter() - start)
            raise
        finally:
            self._inflight.pop(rid, None)
            self._cancelled.discard(rid)
        return self.parse(rid, reply, time.perf_counter() - start)

    @staticmethod
    def parse(request_id: str, reply: dict[str, Any], compute_sec: float = 0.0) -> Generation:
        """Turn a /v1/completions reply into a `Generation`."""
        choice = reply["choices"][0]
        entries = choice.get("logprobs") or {}
        logprobs = tuple(float(x) for x in entries.get("token_logprobs") or ())
        token_ids = choice.get("token_ids")
        if token_ids is None:  # a server without return_token_ids
            token_ids = [int(t.removeprefix("token_id:")) for t in entries.get("tokens") or ()]
        reason = choice.get("finish_reason")
        if reason not in _FINISH_REASONS:
            raise VLLMServerError(200, f"unexpected finish_reason {reason!r}")
        if len(logprobs) != len(token_ids):
            raise VLLMServerError(200, f"{len(token_ids)} tokens but {len(logprobs)} logprobs; "
                                       "was the request sent with logprobs=0?")
        return Generation(
            request_id=request_id,
            token_ids=tuple(int(t) for t in token_ids),
            logprobs=logprobs,
            finish_reason=_FINISH_REASONS[reason],
            stop_reason=choice.get("stop_reason"),
            compute_sec=compute_sec,  # the server's queueing is inside this: it is not reported
        )

    def cancel(self, request_id: str) -> bool:
        call = self._inflight.get(request_id)
        if call is None or call.done() or request_id in self._cancelled:
            return False
        self._cancelled.add(request_id)
        call.get_loop().call_soon_threadsafe(call.cancel)
        return True

    def promote(self, request_id: str) -> bool:
        """Always False: vLLM cannot re-prioritise a request it is running."""
        return False

    def scheduling_stats(self) -> SchedulingStats:
        """Not measured: the server's scheduling is invisible to this client."""
        return SchedulingStats(measured=False)

    # ---- adapters ----------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Load a LoRA adapter folder under `name` (replacing what the server holds under that
        name, also from an earlier client), and check that the server lists it from that folder.

        The path is sent absolute: the server resolves a relative one in its own working
        directory. The server must be able to read it (same machine or a shared file system)."""
        path = os.path.abspath(os.fspath(path))
        # load_inplace: vLLM refuses (400) a name it already holds otherwise
        await self._request("POST", "/v1/load_lora_adapter",
                            {"lora_name": name, "lora_path": path, "load_inplace": True})
        served = {m.get("id"): m.get("root") for m in await self.served_models()}
        if served.get(name) != path:
            raise VLLMServerError(200, f"adapter {name!r} was loaded from {path} but the server lists "
                                       f"{served.get(name) or 'no such adapter'}")

    async def unload_adapter(self, name: str) -> None:
        await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    async def served_models(self) -> list[dict[str, Any]]:
        """The server's /v1/models entries: the base model and every loaded adapter (`id`, `root`:
        the folder it was loaded from, `parent`, `max_model_len`)."""
        return (await self._request("GET", "/v1/models")).get("data", [])

    def check_model(self) -> None:
        """Raise a one-line VLLMServerError unless the server serves `model` under that exact name
        (blocking: call before the event loop runs)."""
        from obsspec.engines.server import served_models

        try:
            entries = served_models(self.base_url, timeout=self._timeout or 30)
        except (OSError, ValueError) as e:
            raise VLLMServerError(0, f"cannot reach the vLLM server at {self.base_url}: {e}") from None
        served = [m.get("id") for m in entries]
        if self.model not in served:
            raise VLLMServerError(404, _not_served(self.model, served))
        self.max_model_len, self._limit_read = _limit(self.model, entries), True

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Abort every request in flight (their connections close) and refuse new ones."""
        self._closed = True
        for call in list(self._inflight.values()):
            call.get_loop().call_soon_threadsafe(call.cancel)

    async def __aenter__(self) -> VLLMEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # ---- HTTP --------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._timeout is None:
            return await self._exchange(method, path, body)
        return await asyncio.wait_for(self._exchange(method, path, body), self._timeout)

    async def _exchange(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """One HTTP/1.1 request on its own connection. Closing the connection on cancellation is
        what tells vLLM to abort the request."""
        data = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._host}:{self._port}",
                "Content-Type: application/json", f"Content-Length: {len(data)}",
                "Connection: close"]
        if self._api_key:
            head.append(f"Authorization: Bearer {self._api_key}")
        reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._ssl)
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
            await writer.drain()
            status, headers = await _read_head(reader)
            if "chunked" in headers.get("transfer-encoding", ""):
                payload = await _read_chunked(reader)
            elif "content-length" in headers:
                payload = await reader.readexactly(int(headers["content-length"]))
            else:
                payload = await reader.read()
        finally:
            writer.close()
        if status >= 400:
            message = _error_message(payload)
            if status == 400 and _TOO_LONG.search(message):
                raise PromptTooLong(message)
            if status == 404 and body and f"`{body.get('model')}` does not exist" in message:
                served = [m.get("id") for m in await self.served_models()]
                raise AdapterNotServed(status, _not_served(body["model"], served))
            raise VLLMServerError(status, message)
        try:
            return json.loads(payload) if payload else {}
        except json.JSONDecodeError:  # e.g. load_lora_adapter answers plain text
            return {"text": payload.decode(errors="replace")}


def _limit(model: str, entries: list[dict[str, Any]]) -> int | None:
    """The max_model_len /v1/models gives for `model` (None when it gives none)."""
    value = next((m.get("max_model_len") for m in entries if m.get("id") == model), None)
    return value if isinstance(value, int) and value > 0 else None


def _not_served(name: str, served: list) -> str:
    return (f"the server does not serve {name!r}; it serves {served} (a model is served under the "
            "exact string given to vllm serve --model, and an adapter under its loaded name)")


def _being_cancelled() -> bool:
    """Whether the current task itself is being cancelled (Python >= 3.11 can tell)."""
    task = asyncio.current_task()
    return bool(task is not None and getattr(task, "cancelling", lambda: 0)())


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise VLLMServerError(0, f"not an HTTP reply: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
        body += await reader.readexactly(size)
        await reader.readline()  # the CRLF after each chunk
    return bytes(body)


def _error_message(payload: bytes) -> str:
    try:
        reply = json.loads(payload)
    except json.JSONDecodeError:
        return payload.decode(errors="replace")[:500]
    if isinstance(reply, dict):
        error = reply.get("error")
        if isinstance(error, dict) and "message" in error:  # newer vLLM
            return str(error["message"])
        if "message" in reply:  # older vLLM: {"object": "error", "message": ...}
            return str(reply["message"])
    return json.dumps(reply)[:500]
