"""Tests of the vLLM client engine against a fake OpenAI-compatible server on 127.0.0.1.

The fake server checks the request JSON the way vLLM's /v1/completions reads it and answers with
canned token ids and logprobs; vLLM itself is never needed. Run:
    .venv/bin/python -m pytest -q tests/test_engine_vllm_adapter.py
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from obsspec.engines import Engine, GenerationRequest
from obsspec.engines.base import PromptTooLong
from obsspec.engines.vllm import VLLMEngine, VLLMServerError

MAX_MODEL_LEN = 1024
SLOW = 999  # a prompt starting with this token is held until the client disconnects
BASE = "Qwen/Qwen3-0.6B"


class FakeVLLM(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def reply(self, status: int, body: dict | str, chunked: bool = False) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:  # uvicorn streams some replies this way; split in two chunks
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (data[:7], data[7:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_GET(self):
        assert self.path == "/v1/models", self.path
        self.reply(200, {"object": "list", "data": [
            {"id": BASE, "root": BASE, "parent": None,
             **({} if self.server.hide_limit else {"max_model_len": MAX_MODEL_LEN})},
            *({"id": name, "root": path, "parent": BASE} for name, path in self.server.loras.items())]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, body, dict(self.headers)))
        if self.path == "/v1/load_lora_adapter":  # vLLM 0.32's answers
            name = body["lora_name"]
            if name in self.server.loras and not body.get("load_inplace"):
                message = (f"The lora adapter '{name}' has already been loaded. If you want to load "
                           "the adapter in place, set 'load_inplace' to True.")
                return self.reply(400, {"error": {"message": message, "type": "InvalidUserInput", "code": 400}})
            self.server.loras[name] = body["lora_path"] if not self.server.stale else "/an/older/version"
            return self.reply(200, f"Success: LoRA adapter '{name}' added successfully.")
        if self.path == "/v1/unload_lora_adapter":
            self.server.loras.pop(body["lora_name"], None)
            return self.reply(200, "Success")
        assert self.path == "/v1/completions", self.path
        if body["model"] not in {BASE, *self.server.loras}:
            message = f"The model `{body['model']}` does not exist."
            return self.reply(404, {"error": {"message": message, "type": "NotFoundError",
                                              "code": 404}})
        prompt = body["prompt"]
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        if body.get("priority", 0) != 0 and not self.server.priority_scheduling:  # vLLM's check
            message = f"Got priority {body['priority']} but Priority scheduling is not enabled."
            return self.reply(400, {"object": "error", "message": message, "type": "BadRequestError",
                                    "code": 400})
        if len(prompt) > MAX_MODEL_LEN:  # vLLM 0.32's wording
            message = (f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your "
                       f"prompt contains at least {len(prompt)} input tokens")
            return self.reply(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
        if body["max_tokens"] > MAX_MODEL_LEN:
            message = (f"max_tokens={body['max_tokens']} cannot be greater than max_model_len={MAX_MODEL_LEN}. "
                       "Please request fewer output tokens.")
            return self.reply(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
        max_tokens = min(body["max_tokens"], MAX_MODEL_LEN - len(prompt))  # cut to fit
        if max_tokens < 1:
            message = f"max_tokens must be at least 1, got {max_tokens}."
            return self.reply(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
        if prompt[0] == SLOW:
            return self.wait_for_disconnect()
        n = min(max_tokens, 4)
        tokens = [100 + i for i in range(n)]
        stops = body["stop_token_ids"]
        stop = stops[0] if stops and n < max_tokens else None
        if stop is not None:
            tokens[-1] = stop
        choice = {
            "index": 0, "text": "abcd"[:n],
            "logprobs": {"token_logprobs": [-0.5 * (i + 1) for i in range(n)],
                         "tokens": [f"token_id:{t}" for t in tokens], "top_logprobs": [None] * n,
                         "text_offset": list(range(n))},
            "finish_reason": "stop" if stop is not None else "length", "stop_reason": stop,
        }
        if prompt[0] != 7:  # prompt 7...: answer like an old server without token_ids
            choice["token_ids"] = tokens
        self.reply(200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                         "choices": [choice], "usage": {}}, chunked=prompt[0] == 8)

    def wait_for_disconnect(self):
        self.connection.settimeout(0.02)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.connection.recv(1) == b"":
                    self.server.disconnects.append(time.monotonic())
                    return
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                break
        self.server.disconnects.append(time.monotonic())


@pytest.fixture()
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    httpd.seen, httpd.loras, httpd.disconnects = [], {}, []
    httpd.stale = False  # True: a load answers 200 but the server keeps serving an older folder
    httpd.hide_limit = False  # True: /v1/models gives no max_model_len
    httpd.priority_scheduling = False
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def engine_for(server, **kwargs) -> VLLMEngine:
    return VLLMEngine(f"http://127.0.0.1:{server.server_address[1]}/v1", model=BASE, **kwargs)


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------------------------


def test_request_json_and_reply_parsing(server):
    request = GenerationRequest([1, 2, 3], max_new_tokens=16, temperature=0.7, top_p=0.9, seed=42,
                                stop_token_ids=(151645,), stop_strings=("</tool_response>",),
                                request_id="r-1")

    async def main():
        async with engine_for(server, api_key="k") as engine:
            assert isinstance(engine, Engine)
            return await engine.generate(request)

    gen = run(main())
    path, body, headers = server.seen[0]
    assert path == "/v1/completions"
    assert body == {
        "model": BASE, "prompt": [1, 2, 3], "max_tokens": 16, "temperature": 0.7, "top_p": 0.9,
        "seed": 42, "stop_token_ids": [151645], "stop": ["</tool_response>"],
        "include_stop_str_in_output": True, "ignore_eos": True, "skip_special_tokens": False,
        "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
        "request_id": "r-1",
    }
    assert headers["Authorization"] == "Bearer k"
    assert gen.request_id == "r-1"
    assert gen.token_ids == (100, 101, 102, 151645)
    assert gen.logprobs == (-0.5, -1.0, -1.5, -2.0)
    assert (gen.finish_reason, gen.stop_reason) == ("stop", 151645)


@pytest.mark.parametrize("first_token", [7, 8], ids=["old-server-token-strings", "chunked-reply"])
def test_reply_variants(server, first_token):
    async def main():
        async with engine_for(server) as engine:
            return await engine.generate(GenerationRequest([first_token, 1], max_new_tokens=3))

    gen = run(main())
    assert gen.token_ids == (100, 101, 102) and gen.finish_reason == "length"
    assert len(gen.logprobs) == 3


def test_adapters_are_served_by_name(server):
    async def main():
        async with engine_for(server) as engine:
            await engine.load_adapter("wm-v1", "/ckpt/wm/v1")
            a = await engine.generate(GenerationRequest([1], max_new_tokens=2, adapter="wm-v1"))
            await engine.load_adapter("wm-v1", "/ckpt/wm/v1b")  # replacing: loaded in place
            await engine.unload_adapter("wm-v1")
            with pytest.raises(VLLMServerError, match="does not serve 'wm-v1'") as error:
                await engine.generate(GenerationRequest([1], max_new_tokens=2, adapter="wm-v1"))
            return a, error.value

    gen, error = run(main())
    assert gen.finish_reason == "length" and error.status == 404
    assert BASE in str(error)  # the names it does serve
    calls = [(path, body.get("lora_name"), body.get("lora_path", body.get("model")))
             for path, body, _ in server.seen]
    assert calls == [
        ("/v1/load_lora_adapter", "wm-v1", "/ckpt/wm/v1"),
        ("/v1/completions", None, "wm-v1"),
        ("/v1/load_lora_adapter", "wm-v1", "/ckpt/wm/v1b"),
        ("/v1/unload_lora_adapter", "wm-v1", None),
        ("/v1/completions", None, "wm-v1"),
    ]


def test_a_fresh_client_replaces_what_the_server_already_holds(server, tmp_path, monkeypatch):
    """A restarted run meets a server still holding `policy-v3` from before: loading it again
    must work (vLLM refuses a held name without load_inplace), from an absolute path."""
    server.loras["policy-v3"] = "/old/run/policy-v3"
    monkeypatch.chdir(tmp_path)
    run(engine_for(server).load_adapter("policy-v3", "adapters/v3"))
    assert server.loras["policy-v3"] == str(tmp_path / "adapters/v3")


def test_a_load_the_server_does_not_list_is_an_error(server):
    """A push that answers 200 while the server keeps serving other weights looks like staleness
    for months: the client checks the server's own listing after every load."""
    server.stale = True
    with pytest.raises(VLLMServerError, match="lists /an/older/version"):
        run(engine_for(server).load_adapter("policy-v4", "/ckpt/policy/v4"))


def test_check_model_names_both_names(server):
    engine_for(server).check_model()
    wrong = VLLMEngine(f"http://127.0.0.1:{server.server_address[1]}", model="Qwen3-0.6B")
    with pytest.raises(VLLMServerError, match=r"does not serve 'Qwen3-0.6B'; it serves \['Qwen/Qwen3-0.6B'\]"):
        wrong.check_model()


def test_task_cancellation_closes_the_connection(server):
    """vLLM aborts a request when its client disconnects: cancelling must disconnect."""

    async def main():
        async with engine_for(server) as engine:
            task = asyncio.create_task(engine.generate(GenerationRequest([SLOW], max_new_tokens=9)))
            while not server.seen:
                await asyncio.sleep(0.005)
            cancelled_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(200):
                if server.disconnects:
                    break
                await asyncio.sleep(0.005)
            return cancelled_at

    cancelled_at = run(main())
    assert server.disconnects, "the server never saw the client go away"
    assert server.disconnects[0] - cancelled_at < 1.0


def test_engine_cancel_returns_a_cancelled_generation(server):
    async def main():
        async with engine_for(server) as engine:
            request = GenerationRequest([SLOW], request_id="slow-1")
            task = asyncio.create_task(engine.generate(request))
            while not server.seen:
                await asyncio.sleep(0.005)
            assert engine.cancel("slow-1") and not engine.cancel("unknown")
            return await task

    gen = run(main())
    assert gen.finish_reason == "cancelled" and gen.token_ids == ()


def test_a_prompt_past_the_servers_context_is_prompt_too_long(server):
    """The world model's prompt can outgrow its context (the history fills the policy's): the
    predictor then makes no draft, which needs this error told apart from other server errors.
    The client cuts max_tokens to the room the server's max_model_len leaves (a world model's
    draft budget can exceed max_model_len itself, which vLLM refuses), so a long generation ends
    as "length", as on the hf engine."""
    def gen(n, max_new_tokens):
        async def main():
            async with engine_for(server) as engine:
                return await engine.generate(GenerationRequest([1] * n, max_new_tokens=max_new_tokens))
        return run(main())

    assert gen(10, MAX_MODEL_LEN + 100).finish_reason == "length"
    assert server.seen[-1][1]["max_tokens"] == MAX_MODEL_LEN - 10
    assert gen(MAX_MODEL_LEN - 8, 9).finish_reason == "length"
    assert server.seen[-1][1]["max_tokens"] == 8
    sent = len(server.seen)
    with pytest.raises(PromptTooLong, match="no room"):
        gen(MAX_MODEL_LEN, 4)
    assert len(server.seen) == sent, "refused before sending"


def test_a_server_that_does_not_say_its_limit_is_read_from_its_answers(server):
    server.hide_limit = True

    def gen(n, max_new_tokens):
        async def main():
            async with engine_for(server) as engine:
                return await engine.generate(GenerationRequest([1] * n, max_new_tokens=max_new_tokens))
        return run(main())

    assert gen(MAX_MODEL_LEN - 8, 9).finish_reason == "length"  # the server cut it
    with pytest.raises(PromptTooLong, match="at least 1"):
        gen(MAX_MODEL_LEN, 4)
    with pytest.raises(PromptTooLong, match="maximum context length"):
        gen(MAX_MODEL_LEN + 1, 4)
    with pytest.raises(VLLMServerError, match="cannot be greater than max_model_len"):
        gen(10, MAX_MODEL_LEN + 100)  # any other 400 is loud, never a silent "no draft"


def test_server_errors_and_unreachable_servers():
    async def unreachable():
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        engine = VLLMEngine(f"http://127.0.0.1:{port}", model=BASE)
        await engine.generate(GenerationRequest([1]))

    with pytest.raises(OSError):
        run(unreachable())
    with pytest.raises(ValueError, match="http://host:port"):
        VLLMEngine("localhost:8000", model=BASE)


def test_parse_rejects_mismatched_logprobs():
    reply = {"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]},
                          "finish_reason": "length"}]}
    with pytest.raises(VLLMServerError, match="logprobs=0"):
        VLLMEngine.parse("r", reply)
    reply["choices"][0]["logprobs"]["token_logprobs"].append(-2.0)
    reply["choices"][0]["finish_reason"] = "abort"
    assert VLLMEngine.parse("r", reply).finish_reason == "cancelled"


def test_close_aborts_requests_in_flight(server):
    from obsspec.engines import EngineClosedError

    async def main():
        engine = engine_for(server)
        task = asyncio.create_task(engine.generate(GenerationRequest([SLOW])))
        while not server.seen:
            await asyncio.sleep(0.005)
        engine.close()
        with pytest.raises(EngineClosedError):
            await task
        with pytest.raises(EngineClosedError):
            await engine.generate(GenerationRequest([1]))

    run(main())


@pytest.mark.parametrize("priority_scheduling", [False, True])
def test_priority_is_sent_only_with_priority_scheduling(server, priority_scheduling):
    """vLLM refuses a non-zero priority unless served with --scheduling-policy priority, so the
    client sends it only when constructed with priority_scheduling=True."""
    server.priority_scheduling = priority_scheduling

    async def main():
        async with engine_for(server, priority_scheduling=priority_scheduling) as engine:
            await engine.generate(GenerationRequest([1, 2], max_new_tokens=2))
            await engine.generate(GenerationRequest([1, 2], max_new_tokens=2, priority=1,
                                                    request_id="spec"))
            return engine.promote("spec"), engine.scheduling_stats()

    promoted, stats = run(main())
    sent = [body.get("priority") for _, body, _ in server.seen]
    assert sent == ([0, 1] if priority_scheduling else [None, None])
    assert promoted is False, "a request running on vLLM cannot be re-prioritised"
    assert not stats.measured and stats.committed_sec == 0 and stats.delay_frac is None


def test_a_priority_sent_to_a_server_without_priority_scheduling_is_refused(server):
    async def main():
        async with engine_for(server, priority_scheduling=True) as engine:
            await engine.generate(GenerationRequest([1, 2], max_new_tokens=2, priority=1))

    with pytest.raises(VLLMServerError, match="Priority scheduling is not enabled"):
        run(main())
