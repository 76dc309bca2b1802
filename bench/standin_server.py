"""A stand-in for a vLLM server on GPUs: the subset of its OpenAI-compatible API obsspec's client
speaks, answering every request after a fixed delay, however many are in flight (a batched GPU
server's latency, not a CPU's). It runs in its own process, so that what it costs is not counted
as obsspec's: it is for measuring obsspec (bench/scale.py), not generation.

    .venv/bin/python bench/standin_server.py --tokenizer obsspec/bases/tiny-cpu/tokenizer \\
        --model policy --world-model wm --gen-s 0.2 --turns 8      # prints the port, then serves

- `/v1/models` lists both names.
- `/v1/completions` for the policy: a tool call chosen by the request's seed (a pure function of
  (episode, turn), so every run is token-identical), `done()` once the prompt holds `--turns`
  observations. For the world model: the right observation of an `echo` command (a hit), "(no
  output)" for anything else (mostly a miss): both paths of speculation are exercised.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenizers import Tokenizer  # noqa: E402  (light: no transformers import in the server)

from obsspec import chat  # noqa: E402

COMMANDS = ["ls -la", "echo step {n}", "pwd && ls | head -n 5", "echo done {n} && ls | wc -l",
            "find . -maxdepth 2 | sort | head -n 20", "echo ok"]
COMMAND = re.compile(r"<parameter=command>\n?(.*?)\n?</parameter>", re.S)


class StandIn:
    def __init__(self, tokenizer: str, model: str, world_model: str, gen_s: float, turns: int):
        self.tok = Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json"))
        self.model, self.world_model, self.gen_s, self.turns = model, world_model, gen_s, turns
        self.im_start = self.tok.token_to_id("<|im_start|>")
        self.im_end = self.tok.token_to_id("<|im_end|>")
        self.requests = 0

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def completion(self, body: dict) -> dict:
        prompt = body["prompt"]
        if body["model"] == self.world_model:
            tail = self.tok.decode(prompt[-160:], skip_special_tokens=False)
            found = COMMAND.findall(tail)
            command = found[-1] if found else ""
            output = command[5:] + "\n" if command.startswith("echo ") and "&&" not in command else ""
            draft = chat.format_observation(output.encode(), 0, cap=4096) + chat.OBS_CLOSE
            ids = self.encode(draft)
        else:
            # the system turn, the user turn and the first generation prompt, then two per observation
            observations = (prompt.count(self.im_start) - 3) // 2
            seed = int(body.get("seed") or 0)
            if observations >= self.turns:
                text = chat.render_done()
            else:
                text = chat.render_bash(COMMANDS[seed % len(COMMANDS)].format(n=seed % 97))
            ids = self.encode(text) + [self.im_end]
        ids = ids[: body.get("max_tokens") or len(ids)]
        return {"choices": [{"token_ids": ids, "finish_reason": "stop", "stop_reason": None,
                             "logprobs": {"token_logprobs": [-0.05] * len(ids)}}]}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
            body = await reader.readexactly(int(headers.get("content-length") or 0))
            path = line.split()[1]
            if path.endswith("/v1/models"):
                reply = {"object": "list", "data": [{"id": m, "root": m, "parent": None, "max_model_len": 1 << 16}
                                                    for m in (self.model, self.world_model)]}
            else:
                self.requests += 1
                await asyncio.sleep(self.gen_s)  # a GPU batch answers everyone at once
                reply = self.completion(json.loads(body))
            data = json.dumps(reply).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up: a cancelled request
        finally:
            writer.close()


async def serve(args) -> None:
    standin = StandIn(args.tokenizer, args.model, args.world_model, args.gen_s, args.turns)
    server = await asyncio.start_server(standin.handle, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json")
    ap.add_argument("--model", default="policy")
    ap.add_argument("--world-model", default="world-model")
    ap.add_argument("--gen-s", type=float, default=0.2, help="seconds every generation takes")
    ap.add_argument("--turns", type=int, default=8, help="commands before done()")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
