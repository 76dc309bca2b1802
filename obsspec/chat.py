"""Text formats the policy and the world model speak: tool calls and observations.

This is the one place where tool calls are rendered and parsed and observation bodies are built;
it works on `str`, and the tokenizer layer sits on top of it.

Tool calls come in two forms, and `parse_action` takes both (`Action.form` says which it was).
Qwen3-Coder's XML (`render_tool_call`) puts every tag on its own line, so a value sits between
one newline after its opening tag and one before its closing tag:

    <tool_call>
    <function=bash>
    <parameter=command>
    ls -la
    </parameter>
    <parameter=timeout>
    30
    </parameter>
    </function>
    </tool_call>

`parse_action` also takes the compact form (`<tool_call><function=done></function></tool_call>`)
and any spaces/tabs/newlines between tags; from a value it strips exactly one leading and one
trailing "\\n" if present, nothing else, so render -> parse gives every value back. A call ends at
the FIRST `</tool_call>` and a value at the FIRST `</parameter>`, so no value can hold either
string: render raises ValueError, and `echo '</parameter>'` written by a policy is a "malformed
tool call". Only the first `<tool_call>` counts; text before it (reasoning) and after it is
ignored, except a reasoning block: when `<think>` comes before the first `<tool_call>`, the call
is looked for after the first `</think>` (an unclosed one is "no tool call").

Qwen3's own form (`render_json_call`, what its chat template writes for a tool call) is one JSON
object inside the same tags: `<tool_call>\\n{"name": "bash", "arguments": {"command": "ls"}}\\n
</tool_call>`. Its `arguments` may be an object or a string holding one (as the template takes
it); `timeout` an integer or a string of digits; a null timeout is no timeout. The call still
ends at the first `</tool_call>`, so a command cannot hold that string in either form.
Tools: `bash(command, timeout=None)` (timeout: integer seconds, 1..600) and `done()`. Which form
the system prompt teaches is the recipe's `policy.tool_format` (obsspec/tool_prompt.py); only
the message for a call that is in neither form depends on it.

Observation body; the policy sees `wrap_observation(body)` = OBS_OPEN + body + OBS_CLOSE, i.e.
"<tool_response>\\n" + body + "\\n</tool_response>" as in Qwen3's chat template, and a world
model is trained to write body + OBS_CLOSE (`split_draft` cuts its generation there):

    hello\\n\\n(exit_code=0)                           output "hello\\n", kept as is
    (no output)\\n(exit_code=1)                         empty output
    abc\\n[... output truncated: 7 more bytes ...]\\n(exit_code=0)    cap=3, output "abcdefghij"
    (command timed out after 10 s)\\n(exit_code=-1)     timeout: partial output is NOT shown
    Error: unknown function (tools: bash, done)        malformed/unknown call: no exit code line

Output bytes are decoded as UTF-8 with errors="replace"; "\\r" and ANSI escapes (ESC) stay raw;
other C0 controls (NUL ...) and DEL become U+FFFD, one character for one, so the text is safe for
a tokenizer. Truncation keeps the first `cap` characters; the marker counts the BYTES not shown,
which lets a sandbox keep only `capture_bytes_for(cap)` bytes plus the total size.
`normalize_draft` puts a world model's predicted body through the same rules; every real body is
a fixed point of it.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
PARAM_CLOSE = "</parameter>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_FORMATS = ("xml", "json")
OBS_OPEN = "<tool_response>\n"
OBS_CLOSE = "\n</tool_response>"
NO_OUTPUT = "(no output)"
MAX_TIMEOUT_S = 600
DEFAULT_MAX_COMMAND_CHARS = 16384

# Fixed error messages: they become the observation the agent sees, so no input is echoed back.
NO_TOOL_CALL = "no tool call found"
EXPECTED_FUNCTION = "malformed tool call: expected <function=NAME> after <tool_call>"
EXPECTED_JSON = 'malformed tool call: expected {"name": ..., "arguments": {...}} after <tool_call>'
BAD_JSON = "malformed tool call: the JSON after <tool_call> does not parse"
DUPLICATE_KEY = "malformed tool call: a key appears twice in the JSON"
UNCLOSED_THINK = "no tool call found: <think> without </think>"
EXPECTED_PARAMETER = "malformed tool call: expected <parameter=NAME> or </function>"
UNCLOSED_PARAMETER = "malformed tool call: unclosed <parameter=...>"
MISSING_CALL_CLOSE = "malformed tool call: missing </tool_call>"
TEXT_AFTER_FUNCTION = "malformed tool call: text after </function>"
UNKNOWN_FUNCTION = "unknown function (tools: bash, done)"
DONE_TAKES_NO_PARAMETERS = "done takes no parameters"
DUPLICATE_PARAMETER = "duplicate parameter"
UNKNOWN_PARAMETER = "bash: unknown parameter (allowed: command, timeout)"
MISSING_COMMAND = "bash: missing parameter 'command'"
EMPTY_COMMAND = "bash: empty command"
BAD_TIMEOUT = f"bash: timeout must be an integer from 1 to {MAX_TIMEOUT_S}"
NUL_IN_COMMAND = "bash: command contains a NUL character"
COMMAND_NOT_STRING = "bash: command must be a string"
SURROGATE_IN_COMMAND = "bash: command contains invalid unicode (lone surrogate)"


def command_too_long(max_chars: int) -> str:
    return f"bash: command longer than {max_chars} characters"


# ---------------------------------------------------------------------------- tool calls


@dataclass(frozen=True)
class Action:
    """A parsed policy turn. kind: "bash" (command, timeout), "done", or "error" (error).

    `form`: "xml" or "json", the form the call was written in ("" when there was no call, or it
    was in neither form). Not compared: the same call in either form is the same action."""

    kind: str
    command: str = ""
    timeout: int | None = None
    error: str = ""
    form: str = field(default="", compare=False)


_WS = r"[ \t\r\n]*"
_NAME = r"[^<>=\s]+"
_FUNCTION_OPEN = re.compile(f"{_WS}<function=({_NAME})>")
_PARAM_OPEN = re.compile(f"{_WS}<parameter=({_NAME})>")
_FUNCTION_CLOSE = re.compile(f"{_WS}</function>")


class _Malformed(Exception):
    def __init__(self, message: str, form: str = "xml"):
        super().__init__(message)
        self.form = form  # "" for a call in neither form


def render_tool_call(name: str, params: dict[str, str] | None = None) -> str:
    """The canonical text of one tool call (see the module docstring)."""
    lines = [CALL_OPEN, f"<function={_checked_name(name)}>"]
    for key, value in (params or {}).items():
        if not isinstance(value, str):
            raise TypeError(f"parameter {key!r} must be a str, got {type(value).__name__}")
        for tag in (PARAM_CLOSE, CALL_CLOSE):
            if tag in value:
                raise ValueError(f"parameter {key!r} cannot contain {tag!r}")
        lines += [f"<parameter={_checked_name(key)}>", value, PARAM_CLOSE]
    return "\n".join([*lines, "</function>", CALL_CLOSE])


def render_json_call(name: str, arguments: dict | None = None) -> str:
    """One call in Qwen3's JSON form, as its chat template writes a message's tool call."""
    text = json.dumps(arguments or {}, ensure_ascii=False)  # (the template's `tojson`)
    if CALL_CLOSE in text:
        raise ValueError(f"a JSON tool call cannot contain {CALL_CLOSE!r}")
    if not re.fullmatch(r"[\w.-]+", name):  # the template writes the name unescaped
        raise ValueError(f"invalid tool or parameter name {name!r}")
    return f'{CALL_OPEN}\n{{"name": "{name}", "arguments": {text}}}\n{CALL_CLOSE}'


def render_bash(command: str, timeout: int | None = None, form: str = "xml") -> str:
    if form == "json":
        return render_json_call("bash", {"command": command, **({} if timeout is None else {"timeout": timeout})})
    timeout_param = {} if timeout is None else {"timeout": str(timeout)}
    return render_tool_call("bash", {"command": command, **timeout_param})


def render_done(form: str = "xml") -> str:
    return render_json_call("done") if form == "json" else render_tool_call("done")


def _checked_name(name: str) -> str:
    if not re.fullmatch(_NAME, name):
        raise ValueError(f"invalid tool or parameter name {name!r}")
    return name


def parse_action(text: str, *, tool_format: str = "xml",
                 max_command_chars: int = DEFAULT_MAX_COMMAND_CHARS) -> Action:
    """Parse the first tool call in `text`, in either form; every problem becomes kind="error"
    with a fixed message. `tool_format`, the form the prompt teaches, only picks the message for
    a call in neither form."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
    start = text.find(CALL_OPEN)
    think = text.find(THINK_OPEN)
    if 0 <= think and (start < 0 or think < start):
        # Reasoning may quote a call; the one that counts comes after it.
        think_end = text.find(THINK_CLOSE, think)
        if think_end < 0:
            return Action("error", error=UNCLOSED_THINK)
        start = text.find(CALL_OPEN, think_end)
    if start < 0:
        return Action("error", error=NO_TOOL_CALL)
    # The call ends at the first </tool_call>, as in common Qwen3 parsers and stop strings.
    end = text.find(CALL_CLOSE, start)
    if end < 0:
        return Action("error", error=MISSING_CALL_CLOSE)
    inner = text[start + len(CALL_OPEN):end]
    form = "json" if inner.lstrip(" \t\r\n").startswith("{") else "xml"
    try:
        name, params = _parse_json_call(inner) if form == "json" else _parse_call(inner, tool_format)
    except _Malformed as e:
        return Action("error", error=str(e), form=e.form)
    if name == "done":
        return Action("error", error=DONE_TAKES_NO_PARAMETERS, form=form) if params else Action("done", form=form)
    if name != "bash":
        return Action("error", error=UNKNOWN_FUNCTION, form=form)
    message = _bash_error(params, max_command_chars)
    if message:
        return Action("error", error=message, form=form)
    values = dict(params)
    timeout = values.get("timeout")
    return Action("bash", command=values["command"], timeout=None if timeout is None else int(timeout),
                  form=form)


def _parse_call(text: str, tool_format: str = "xml") -> tuple[str, list[tuple[str, str]]]:
    match = _FUNCTION_OPEN.match(text)
    if not match:
        raise _Malformed(_NEITHER[tool_format], form="")
    name, pos, params = match[1], match.end(), []
    while not (close := _FUNCTION_CLOSE.match(text, pos)):
        match = _PARAM_OPEN.match(text, pos)
        if not match:
            raise _Malformed(EXPECTED_PARAMETER)
        end = text.find(PARAM_CLOSE, match.end())
        if end < 0:
            raise _Malformed(UNCLOSED_PARAMETER)
        params.append((match[1], _strip_one_newline(text[match.end():end])))
        pos = end + len(PARAM_CLOSE)
    if text[close.end():].strip(" \t\r\n"):
        raise _Malformed(TEXT_AFTER_FUNCTION)
    return name, params


_NEITHER = {"xml": EXPECTED_FUNCTION, "json": EXPECTED_JSON}


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Malformed(DUPLICATE_KEY, form="json")
    return dict(pairs)


def _parse_json_call(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(name, [(parameter, value as text)]) of a JSON call, checked as far as its form goes."""
    try:
        call = json.loads(text, object_pairs_hook=_unique_keys)
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):
            arguments = json.loads(arguments, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError)
        raise _Malformed(BAD_JSON, form="json") from None
    if not (isinstance(call, dict) and set(call) <= {"name", "arguments"} and isinstance(call.get("name"), str)
            and isinstance(arguments, dict)):
        raise _Malformed(EXPECTED_JSON, form="json")
    params = []
    for key, value in arguments.items():
        if key == "timeout" and value is None:
            continue  # null: no timeout
        if key == "command" and call["name"] == "bash" and not isinstance(value, str):
            raise _Malformed(COMMAND_NOT_STRING, form="json")
        # An integer timeout is checked as its digits; anything else that is not text fails that check.
        text_value = value if isinstance(value, str) else str(value) if type(value) is int else "?"
        params.append((key, text_value))
    return call["name"], params


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _bash_error(params: list[tuple[str, str]], max_chars: int) -> str:
    keys = [key for key, _ in params]
    if len(set(keys)) != len(keys):
        return DUPLICATE_PARAMETER
    if not set(keys) <= {"command", "timeout"}:
        return UNKNOWN_PARAMETER
    values = dict(params)
    command = values.get("command")
    if command is None:
        return MISSING_COMMAND
    if not command.strip():
        return EMPTY_COMMAND
    if len(command) > max_chars:
        return command_too_long(max_chars)
    if "\x00" in command:
        return NUL_IN_COMMAND
    if re.search("[\ud800-\udfff]", command):
        return SURROGATE_IN_COMMAND
    timeout = values.get("timeout")
    # ASCII digits only: int() would also take " 30", "+30", "3_0" and non-ASCII digits.
    if timeout is None or (re.fullmatch("[0-9]{1,9}", timeout) and 1 <= int(timeout) <= MAX_TIMEOUT_S):
        return ""
    return BAD_TIMEOUT


# ---------------------------------------------------------------------------- observations

# Control characters a tokenizer should not see raw; one for one, so lengths never change.
# Surrogates cover drafts (a str may hold them) and the byte-span marks below.
_SAFE = {c: 0xFFFD for c in [*range(0x20), 0x7F] if c not in (0x09, 0x0A, 0x0D, 0x1B)}
_SAFE.update({c: 0xFFFD for c in range(0xD800, 0xE000)})

# Decoding with this handler gives errors="replace" text, except that each replaced byte run is a
# lone surrogate encoding the run's length, so the bytes behind any prefix of the text are known.
_MARK = 0xDC00


def _mark_span(error: UnicodeDecodeError) -> tuple[str, int]:
    span = error.end - error.start
    if not 1 <= span <= 3:  # UTF-8 replaces runs of at most 3 bytes
        raise ValueError(f"unexpected invalid UTF-8 run of {span} bytes") from error
    return chr(_MARK + span), error.end


codecs.register_error("obsspec.byte_span", _mark_span)


def _marked_byte_len(marked: str) -> int:
    size = len(marked.encode("utf-8", "surrogatepass"))  # a mark encodes as 3 bytes
    return size + sum(marked.count(chr(_MARK + span)) * (span - 3) for span in (1, 2))


def capture_bytes_for(cap: int) -> int:
    """Bytes a sandbox must keep so that the body is the same as with the whole output.

    A character (or replaced byte run) takes at most 4 bytes and UTF-8 decoding of a character
    looks at most 4 bytes ahead, so the first `cap` characters are settled by the first 4*cap bytes.
    """
    return 4 * cap


def truncation_marker(bytes_cut: int) -> str:
    return f"\n[... output truncated: {bytes_cut} more bytes ...]"


def timeout_message(timeout_s: float | None) -> str:
    return "(command timed out)" if timeout_s is None else f"(command timed out after {timeout_s:g} s)"


def format_observation(output: bytes, exit_code: int, *, cap: int, total_bytes: int | None = None,
                       timed_out: bool = False, timeout_s: float | None = None) -> str:
    """The observation body for a command's combined output.

    `output` may be a prefix of the real output: then `total_bytes` is the full size and the prefix
    must hold at least `capture_bytes_for(cap)` bytes. A timeout ignores output and exit_code: what
    was printed before the kill depends on timing, so it is not shown.
    """
    if timed_out:
        return f"{timeout_message(timeout_s)}\n(exit_code=-1)"
    total = len(output) if total_bytes is None else total_bytes
    if cap < 0 or total < len(output):
        raise ValueError(f"need cap >= 0 and total_bytes >= len(output), got {cap}, {total}")
    if total > len(output) and len(output) < capture_bytes_for(cap):
        raise ValueError(f"a truncated capture needs {capture_bytes_for(cap)} bytes, got {len(output)}")
    # Only the first capture_bytes_for(cap) bytes can reach the body; decode no more.
    marked = output[:capture_bytes_for(cap)].decode("utf-8", "obsspec.byte_span")[:cap]
    bytes_cut = total - _marked_byte_len(marked)
    return f"{_content(marked.translate(_SAFE), bytes_cut)}\n(exit_code={exit_code})"


def _content(shown: str, bytes_cut: int) -> str:
    if bytes_cut:
        return shown + truncation_marker(bytes_cut)
    return shown or NO_OUTPUT


def error_observation(message: str) -> str:
    """Body for a malformed or unknown call: `Error: <message>`, no exit code (nothing ran)."""
    return f"Error: {message}"


_TRAILER = re.compile(r"\n\(exit_code=-?[0-9]+\)\Z")
_MARKER = re.compile(r"\n\[\.\.\. output truncated: ([1-9][0-9]{0,17}) more bytes \.\.\.\]\Z")
_TIMEOUT = re.compile(r"\(command timed out(?: after [^\n()]* s)?\)")


def normalize_draft(body: str, *, cap: int) -> str:
    """A predicted body put through the rules of `format_observation` (real bodies are fixed points).

    A draft longer than `cap` characters is cut and its marker counts the UTF-8 bytes of the cut
    text. A draft without the `(exit_code=N)` line is only normalised; it can match no real body.
    """
    trailer = _TRAILER.search(body)
    content, tail = (body[:trailer.start()], trailer[0]) if trailer else (body, "")
    if content == NO_OUTPUT or _TIMEOUT.fullmatch(content):
        return body
    marker = _MARKER.search(content)
    shown, bytes_cut = (content[:marker.start()], int(marker[1])) if marker else (content, 0)
    shown = shown.translate(_SAFE)
    bytes_cut += len(shown[cap:].encode("utf-8"))
    return _content(shown[:cap], bytes_cut) + tail


def wrap_observation(body: str) -> str:
    return OBS_OPEN + body + OBS_CLOSE


def split_draft(generated_text: str) -> str | None:
    """The body of a world model's generation, cut at the first `OBS_CLOSE`; None if unfinished.

    A real body that itself contains OBS_CLOSE can therefore never be predicted exactly: that costs
    a rollback, never correctness.
    """
    end = generated_text.find(OBS_CLOSE)
    return None if end < 0 else generated_text[:end]
