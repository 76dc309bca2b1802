"""Tests for obsspec.chat: tool-call rendering/parsing and observation formatting."""

from __future__ import annotations

import dataclasses
import random

import pytest

from obsspec import chat
from obsspec.chat import (
    OBS_CLOSE,
    OBS_OPEN,
    Action,
    capture_bytes_for,
    error_observation,
    format_observation,
    normalize_draft,
    parse_action,
    render_bash,
    render_done,
    render_tool_call,
    split_draft,
    wrap_observation,
)
from obsspec.tool_prompt import system_prompt, xml_description

LS = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>"


def err(message: str) -> Action:
    return Action("error", error=message)


def bash_call(*params: str) -> str:
    return "<tool_call><function=bash>" + "".join(params) + "</function></tool_call>"


def param(name: str, value: str) -> str:
    return f"<parameter={name}>{value}</parameter>"


# ---------------------------------------------------------------------------- rendering


def test_render_canonical_forms():
    assert render_tool_call("bash", {"command": "ls -la"}) == LS
    assert render_bash("ls -la") == LS
    assert render_bash("sleep 1", timeout=30) == (
        "<tool_call>\n<function=bash>\n<parameter=command>\nsleep 1\n</parameter>\n"
        "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
    )
    assert render_done() == "<tool_call>\n<function=done>\n</function>\n</tool_call>"
    assert render_tool_call("done", {}) == render_done()


def test_render_rejects_what_cannot_round_trip():
    with pytest.raises(ValueError, match="cannot contain '</parameter>'"):
        render_bash("echo '</parameter>'")
    with pytest.raises(ValueError, match="cannot contain '</tool_call>'"):
        render_bash("echo '</tool_call>'")
    with pytest.raises(ValueError, match="invalid tool or parameter name"):
        render_tool_call("ba sh", {})
    with pytest.raises(ValueError, match="invalid tool or parameter name"):
        render_tool_call("bash", {"com<mand": "ls"})
    with pytest.raises(TypeError, match="must be a str"):
        render_tool_call("bash", {"command": "ls", "timeout": 30})


ROUND_TRIP_COMMANDS = [
    "ls -la",
    "cd /app && make test > out.log 2>&1 || echo 'failed' < /dev/null",
    "cat <<'EOF' > a.py\nprint(\"hi\")\n\nx = 1 < 2\nEOF\npython3 a.py",
    "echo '</function>' '<tool_call>' '<function=done>' '<parameter=timeout>' '</tool_response>'",
    'echo "double" \'single\' `back`',
    "\nleading and trailing newlines\n",
    "\n\necho blank lines\n\n",
    "  spaces kept  ",
    "printf 'a\\tb'\r\n",
    "echo héllo € 😀 \ufffd",
]


@pytest.mark.parametrize("command", ROUND_TRIP_COMMANDS)
@pytest.mark.parametrize("timeout", [None, 1, 600])
def test_render_parse_round_trip(command, timeout):
    assert parse_action(render_bash(command, timeout)) == Action("bash", command, timeout)


def test_render_parse_round_trip_random_commands():
    rng = random.Random(7)
    alphabet = ["a", " ", "\n", "\t", "\r", "<", ">", "/", "=", "'", '"', "&", "é", "😀",
                "parameter", "</function>", "<tool_call>", "</tool_", "call>", "<parameter=x>",
                "</param"]
    for _ in range(2000):
        command = "x" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        if chat.PARAM_CLOSE in command or chat.CALL_CLOSE in command:
            continue
        assert parse_action(render_bash(command)) == Action("bash", command), repr(command)


# ---------------------------------------------------------------------------- parsing


def test_parse_compact_and_spaced_forms():
    assert parse_action(bash_call(param("command", "ls -la"))) == Action("bash", "ls -la")
    assert parse_action("<tool_call><function=done></function></tool_call>") == Action("done")
    spaced = ("<tool_call> \n\t<function=bash>\n\n<parameter=command>ls</parameter>  \n"
              "</function>\r\n</tool_call>")
    assert parse_action(spaced) == Action("bash", "ls")


def test_parse_strips_exactly_one_newline_each_side():
    assert parse_action(bash_call(param("command", "\n\nls\n\n"))).command == "\nls\n"
    assert parse_action(bash_call(param("command", "\nls"))).command == "ls"
    assert parse_action(bash_call(param("command", "ls\n"))).command == "ls"
    assert parse_action(bash_call(param("command", " ls "))).command == " ls "
    assert parse_action(bash_call(param("command", "\r\nls\r\n"))).command == "\r\nls\r"


def test_parse_reasoning_before_and_first_call_wins():
    text = "I should list files.\n\n" + LS + "\nthen\n" + render_bash("rm -rf /") + render_done()
    assert parse_action(text) == Action("bash", "ls -la")
    assert parse_action("ok, finished. " + render_done() + LS) == Action("done")
    # The first call counts even when it is broken and a later one is fine.
    broken = "<tool_call><function=bash><parameter=command>ls</function></tool_call>"
    assert parse_action(broken + LS) == err(chat.UNCLOSED_PARAMETER)


def test_parse_timeout():
    assert parse_action(render_bash("make", 1)) == Action("bash", "make", 1)
    assert parse_action(render_bash("make", 600)) == Action("bash", "make", 600)
    assert parse_action(bash_call(param("command", "make"), param("timeout", "030"))).timeout == 30
    reordered = bash_call(param("timeout", "5"), param("command", "make"))
    assert parse_action(reordered) == Action("bash", "make", 5)


@pytest.mark.parametrize("value", ["0", "601", "-5", "+5", " 30", "30 ", "3_0", "abc", "1.5", "",
                                   "\u0663", "9" * 5000, "10000000000"])
def test_parse_bad_timeout(value):
    call = bash_call(param("command", "ls"), param("timeout", value))
    assert parse_action(call) == err(chat.BAD_TIMEOUT)


@pytest.mark.parametrize("text", ["", "just thinking, no call", "<tool_call", "<function=bash>ls</function>",
                                  "<tool_cal><function=done></function></tool_cal>"])
def test_parse_no_tool_call(text):
    assert parse_action(text) == err(chat.NO_TOOL_CALL)


@pytest.mark.parametrize("text, message", [
    ("<tool_call>", chat.MISSING_CALL_CLOSE),
    ("<tool_call><function=done></function>", chat.MISSING_CALL_CLOSE),
    ("<tool_call><function=bash><parameter=command>ls</parameter></function>", chat.MISSING_CALL_CLOSE),
    ("<tool_call><function=bash><parameter=command>ls", chat.MISSING_CALL_CLOSE),
    ("<tool_call></tool_call>", chat.EXPECTED_FUNCTION),
    ("<tool_call>ls -la</tool_call>", chat.EXPECTED_FUNCTION),
    ("<tool_call><tool_call><function=done></function></tool_call></tool_call>", chat.EXPECTED_FUNCTION),
    ("<tool_call><function bash></function></tool_call>", chat.EXPECTED_FUNCTION),
    ("<tool_call><function=></function></tool_call>", chat.EXPECTED_FUNCTION),
    ("<tool_call>x<function=done></function></tool_call>", chat.EXPECTED_FUNCTION),
    ("<tool_call><function=bash><parameter=command>ls</parameter></tool_call>", chat.EXPECTED_PARAMETER),
    ("<tool_call><function=bash><parameter=command>ls</parameter>junk</function></tool_call>",
     chat.EXPECTED_PARAMETER),
    ("<tool_call><function=bash>ls</function></tool_call>", chat.EXPECTED_PARAMETER),
    ("<tool_call><function=bash><parameter=command>ls</function></tool_call>", chat.UNCLOSED_PARAMETER),
    ("<tool_call><function=done></function>x</tool_call>", chat.TEXT_AFTER_FUNCTION),
    ("<tool_call><function=done></function></function></tool_call>", chat.TEXT_AFTER_FUNCTION),
    # The call ends at the first </tool_call>, even inside a value.
    (bash_call(param("command", "echo '</tool_call>'")), chat.UNCLOSED_PARAMETER),
    # A value ends at the first </parameter>: the rest is garbage.
    (bash_call(param("command", "echo '</parameter>'")), chat.EXPECTED_PARAMETER),
])
def test_parse_malformed(text, message):
    assert parse_action(text) == err(message)


def test_parse_function_and_parameter_errors():
    assert parse_action(render_tool_call("python", {"code": "1"})) == err(chat.UNKNOWN_FUNCTION)
    assert parse_action(render_tool_call("Bash", {"command": "ls"})) == err(chat.UNKNOWN_FUNCTION)
    assert parse_action(render_tool_call("done", {"reason": "ok"})) == err(chat.DONE_TAKES_NO_PARAMETERS)
    assert parse_action(bash_call()) == err(chat.MISSING_COMMAND)
    assert parse_action(bash_call(param("timeout", "5"))) == err(chat.MISSING_COMMAND)
    assert parse_action(bash_call(param("cmd", "ls"))) == err(chat.UNKNOWN_PARAMETER)
    ls = param("command", "ls")
    assert parse_action(bash_call(ls, param("cwd", "/"))) == err(chat.UNKNOWN_PARAMETER)
    assert parse_action(bash_call(ls, param("command", "pwd"))) == err(chat.DUPLICATE_PARAMETER)
    twice = bash_call(ls, param("timeout", "1"), param("timeout", "1"))
    assert parse_action(twice) == err(chat.DUPLICATE_PARAMETER)
    for empty in ["", "\n", "\n\n", "   ", "\n \t\n"]:
        assert parse_action(bash_call(param("command", empty))) == err(chat.EMPTY_COMMAND)


def test_parse_command_content_limits():
    assert chat.UNKNOWN_FUNCTION == "unknown function (tools: bash, done)"
    assert chat.command_too_long(16384) == "bash: command longer than 16384 characters"
    assert parse_action(render_bash("x" * 16384)) == Action("bash", "x" * 16384)
    assert parse_action(render_bash("x" * 16385)) == err("bash: command longer than 16384 characters")
    assert parse_action(render_bash("x" * 11), max_command_chars=10) == err(chat.command_too_long(10))
    assert parse_action(render_bash("echo a\x00b")) == err(chat.NUL_IN_COMMAND)
    assert parse_action(render_bash("echo \udcff")) == err(chat.SURROGATE_IN_COMMAND)
    assert parse_action(render_bash("echo \ud83d")) == err(chat.SURROGATE_IN_COMMAND)
    assert parse_action(render_bash("echo \ufffd")) == Action("bash", "echo \ufffd")


def test_action_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse_action(LS).command = "rm -rf /"  # type: ignore[misc]


def test_tools_description_shows_the_exact_call_format():
    text = xml_description()
    assert LS in text and render_done() in text
    assert "bash(command, timeout)" in text and "done()" in text and "1 to 600" in text
    assert xml_description() == text == system_prompt("xml")


# ---------------------------------------------------------------------------- observations


def obs(output: bytes, cap: int, exit_code: int = 0, **kwargs) -> str:
    return format_observation(output, exit_code, cap=cap, **kwargs)


def cut(n: int) -> str:
    return f"\n[... output truncated: {n} more bytes ...]"


EXIT0 = "\n(exit_code=0)"


@pytest.mark.parametrize("exit_code", [0, 1, 127, 255, -1])
def test_observation_exit_codes(exit_code):
    assert format_observation(b"hi\n", exit_code, cap=100) == f"hi\n\n(exit_code={exit_code})"
    assert format_observation(b"", exit_code, cap=100) == f"(no output)\n(exit_code={exit_code})"


def test_observation_decoding_and_control_characters():
    assert obs(b"ok", cap=10) == "ok\n(exit_code=0)"
    assert obs(b"\xff\xfeab\xe2\x82", cap=10, exit_code=1) == "\ufffd\ufffdab\ufffd\n(exit_code=1)"
    assert obs("é€😀".encode(), cap=10) == "é€😀" + EXIT0
    assert obs(b"\xef\xbf\xbd", cap=10) == "\ufffd" + EXIT0
    binary = b"\x7fELF\x02\x01\x00\x00\x03\x00>\x00\x01\x00\x00\x00"
    assert obs(binary, cap=100) == "\ufffdELF" + "\ufffd" * 6 + ">" + "\ufffd" * 5 + EXIT0
    # Kept raw: tab, newline, carriage return and ANSI escape sequences.
    raw = b"a\tb\r\nprogress 10%\rprogress 100%\n\x1b[31mred\x1b[0m\n"
    assert obs(raw, cap=100) == raw.decode() + EXIT0
    assert obs(b"\x00\x07\x08\x0b\x0c\x1f", cap=100) == "\ufffd" * 6 + EXIT0


def test_observation_truncation_boundaries():
    assert obs(b"abcde", cap=5) == "abcde\n(exit_code=0)"
    assert obs(b"abcdef", cap=5) == "abcde\n[... output truncated: 1 more bytes ...]\n(exit_code=0)"
    assert obs(b"abcdefghij", cap=3, exit_code=2) == "abc" + cut(7) + "\n(exit_code=2)"
    # Caps count characters; the marker counts the bytes that were not shown.
    assert obs("aé".encode(), cap=2) == "aé" + EXIT0
    assert obs("aé".encode(), cap=1) == "a" + cut(2) + EXIT0
    assert obs("€😀x".encode(), cap=1) == "€" + cut(5) + EXIT0
    assert obs("€😀x".encode(), cap=2) == "€😀" + cut(1) + EXIT0
    # A replaced run of invalid bytes is one character standing for all its bytes.
    assert obs(b"a\xf0\x9f\x98b", cap=2) == "a\ufffd" + cut(1) + EXIT0
    assert obs(b"ab\n", cap=3) == "ab\n" + EXIT0
    assert obs(b"ab\n", cap=2) == "ab" + cut(1) + EXIT0
    assert obs(b"abc", cap=0) == cut(3) + EXIT0
    assert obs(b"", cap=0) == "(no output)" + EXIT0


def test_observation_from_a_capped_capture():
    assert capture_bytes_for(0) == 0 and capture_bytes_for(10) == 40
    full = "😀".encode() * 10 + b"tail"
    prefix = full[:capture_bytes_for(3)]
    assert obs(full, cap=3) == "😀😀😀" + cut(32) + EXIT0
    assert obs(prefix, cap=3, total_bytes=len(full)) == "😀😀😀" + cut(32) + EXIT0
    assert obs(b"", cap=0, total_bytes=9) == cut(9) + EXIT0
    with pytest.raises(ValueError, match="a truncated capture needs 12 bytes, got 11"):
        obs(full[:11], cap=3, total_bytes=len(full))
    with pytest.raises(ValueError, match="total_bytes >= len"):
        obs(b"abc", cap=3, total_bytes=2)
    with pytest.raises(ValueError, match="cap >= 0"):
        obs(b"abc", cap=-1)


def test_observation_timeout_hides_partial_output():
    assert obs(b"partial", cap=100, exit_code=137, timed_out=True, timeout_s=10) == (
        "(command timed out after 10 s)\n(exit_code=-1)")
    assert obs(b"", cap=100, timed_out=True, timeout_s=2.5) == (
        "(command timed out after 2.5 s)\n(exit_code=-1)")
    assert obs(b"x", cap=1, timed_out=True) == "(command timed out)\n(exit_code=-1)"


def test_error_observation_and_wrapping():
    assert error_observation(chat.NO_TOOL_CALL) == "Error: no tool call found"
    assert OBS_OPEN == "<tool_response>\n" and OBS_CLOSE == "\n</tool_response>"
    assert wrap_observation("(no output)" + EXIT0) == (
        "<tool_response>\n(no output)\n(exit_code=0)\n</tool_response>")


def test_split_draft():
    assert split_draft("hi\n(exit_code=0)\n</tool_response>") == "hi\n(exit_code=0)"
    assert split_draft("hi\n(exit_code=0)\n</tool_response><|im_end|>junk") == "hi\n(exit_code=0)"
    assert split_draft("a\n</tool_response>b\n</tool_response>") == "a"
    assert split_draft("hi\n(exit_code=0)") is None
    assert split_draft("hi</tool_response>") is None  # the tag comes after a newline
    assert split_draft("\n</tool_response>") == ""
    body = "x\n(exit_code=3)"
    assert split_draft(wrap_observation(body)[len(OBS_OPEN):]) == body


# ---------------------------------------------------------------------------- drafts


def test_normalize_draft_applies_the_real_rules():
    assert normalize_draft("hello\n(exit_code=0)", cap=100) == "hello\n(exit_code=0)"
    assert normalize_draft("abcdef" + EXIT0, cap=3) == (
        "abc\n[... output truncated: 3 more bytes ...]\n(exit_code=0)")
    assert normalize_draft("a€€" + EXIT0, cap=2) == "a€" + cut(3) + EXIT0
    # An over-long draft that already has a marker adds the cut bytes to it.
    assert normalize_draft("abcd" + cut(5) + EXIT0, cap=3) == "abc" + cut(6) + EXIT0
    assert normalize_draft("a\x00b\udcff\x1b[0m\n(exit_code=1)", cap=100) == (
        "a\ufffdb\ufffd\x1b[0m\n(exit_code=1)")
    assert normalize_draft(EXIT0, cap=100) == "(no output)" + EXIT0
    assert normalize_draft("(no output)" + EXIT0, cap=2) == "(no output)" + EXIT0
    timeout = "(command timed out after 10 s)\n(exit_code=-1)"
    assert normalize_draft(timeout, cap=2) == timeout
    # No exit code line: only normalised, so it can match no real body.
    assert normalize_draft("abcdef", cap=3) == "abc" + cut(3)
    assert normalize_draft("", cap=3) == "(no output)"


def random_output(rng: random.Random) -> bytes:
    pieces = [b"a", b"bc ", b"\n", b"\r", b"\t", b"\x1b[1;31m", b"\x00", b"\x07", b"\x7f", b"<tool_response>",
              "é".encode(), "€".encode(), "😀".encode(), "😀".encode()[:2], "€".encode()[:1],
              b"\xef\xbf\xbd", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
              b"(no output)", b"\n(exit_code=0)", cut(5).encode(), cut(0).encode(),
              b"\n[... output truncated: 05 more bytes ...]", b"(command timed out after 3 s)"]
    out = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
    if rng.random() < 0.3:
        out += bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
    if rng.random() < 0.1:
        out = rng.choice(pieces[-6:])  # a whole output that looks like a format element
    return out


def test_real_bodies_are_fixed_points_of_normalize_draft():
    rng = random.Random(1234)
    for _ in range(5000):
        output, cap = random_output(rng), rng.randint(0, 60)
        exit_code, timed_out = rng.choice([0, 1, 2, 127, 255, -1, -9]), rng.random() < 0.05
        timeout_s = rng.choice([None, 5, 1.5])
        body = obs(output, cap=cap, exit_code=exit_code, timed_out=timed_out, timeout_s=timeout_s)
        assert normalize_draft(body, cap=cap) == body, (output, cap)


def test_capture_prefix_gives_the_same_body_as_the_full_output():
    rng = random.Random(99)
    for _ in range(3000):
        output, cap = random_output(rng), rng.randint(0, 30)
        prefix = output[:capture_bytes_for(cap)]
        full = format_observation(output, 5, cap=cap)
        assert format_observation(prefix, 5, cap=cap, total_bytes=len(output)) == full, (output, cap)


def test_decoding_matches_errors_replace_and_counts_every_byte():
    rng = random.Random(5)
    for _ in range(3000):
        alphabet = b"\x80\xbf\xc2\xe0\xed\xef\xf0\xf4\xf5\xffAz"
        output = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))
        text = output.decode("utf-8", "replace")
        assert format_observation(output, 0, cap=100) == text + "\n(exit_code=0)"
        for cap in range(len(text)):  # the marker must count exactly the bytes behind the cut characters
            body = format_observation(output, 0, cap=cap)
            cut = int(body.rsplit("truncated: ", 1)[1].split(" ")[0])
            assert len(output) - cut == len(output[:len(output) - cut])
            assert output[:len(output) - cut].decode("utf-8", "replace") == text[:cap], (output, cap)


def test_normalize_draft_is_idempotent_on_arbitrary_text():
    rng = random.Random(3)
    alphabet = ["a", "\n", "\x00", "\udc80", "€", "(no output)", "\n(exit_code=0)", "\n(exit_code=-1)",
                "\n[... output truncated: 7 more bytes ...]", "(command timed out after 3 s)"]
    for _ in range(3000):
        draft, cap = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))), rng.randint(0, 20)
        once = normalize_draft(draft, cap=cap)
        assert normalize_draft(once, cap=cap) == once, (draft, cap)
