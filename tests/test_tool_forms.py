"""The two tool-call forms (Qwen3-Coder XML, Qwen3's JSON) and reasoning blocks, in obsspec.chat,
and the system prompt that teaches one (obsspec.tool_prompt).

Run: .venv/bin/python -m pytest -q tests/test_tool_forms.py
"""

from __future__ import annotations

import json

import pytest

from obsspec import chat
from obsspec.chat import Action, parse_action, render_bash, render_done, render_json_call
from obsspec.tool_prompt import JSON_SYSTEM, TOOL_SCHEMAS, system_prompt, xml_description

JSON_LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'


def err(message: str, form: str = "") -> Action:
    return Action("error", error=message, form=form)


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


# ---------------------------------------------------------------------------- rendering


def test_json_render_is_what_qwen3s_template_writes_for_a_call():
    assert render_bash("ls -la", form="json") == JSON_LS
    assert render_bash("sleep 1", 30, form="json") == (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "sleep 1", "timeout": 30}}\n</tool_call>')
    assert render_done(form="json") == '<tool_call>\n{"name": "done", "arguments": {}}\n</tool_call>'
    # non-ASCII stays as is (tojson is json.dumps with ensure_ascii=False); quotes and newlines escaped
    assert render_json_call("bash", {"command": 'echo "héllo"\nls'}) == (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "echo \\"héllo\\"\\nls"}}\n</tool_call>')
    with pytest.raises(ValueError, match="cannot contain '</tool_call>'"):
        render_bash("echo '</tool_call>'", form="json")
    with pytest.raises(ValueError, match="invalid tool or parameter name"):
        render_json_call('ba"sh', {})


@pytest.mark.parametrize("command", ["ls -la", "  spaces kept  ", "\nnewlines\n", "echo '</parameter>'",
                                     "cat <<'EOF' > a.py\nprint(\"hi\\n\")\nEOF", "echo héllo € 😀 \t tab"])
@pytest.mark.parametrize("timeout", [None, 1, 600])
def test_json_round_trip(command, timeout):
    action = parse_action(render_bash(command, timeout, form="json"))
    assert action == Action("bash", command, timeout) and action.form == "json"


def test_either_form_parses_whichever_the_prompt_teaches():
    for taught in ("xml", "json"):
        for form in ("xml", "json"):
            action = parse_action(render_bash("ls", form=form), tool_format=taught)
            assert action == Action("bash", "ls") and action.form == form
            done = parse_action(render_done(form=form), tool_format=taught)
            assert done == Action("done") and done.form == form
    assert Action("bash", "ls", form="xml") == Action("bash", "ls", form="json"), "form is not compared"
    with pytest.raises(ValueError, match="tool_format"):
        parse_action(JSON_LS, tool_format="yaml")


# ---------------------------------------------------------------------------- JSON parsing


def test_json_forms_a_model_may_write():
    compact = call('{"name":"bash","arguments":{"command":"ls"}}')
    assert parse_action(compact) == Action("bash", "ls")
    # arguments as a string holding an object (the template takes that too)
    as_string = call(json.dumps({"name": "bash", "arguments": json.dumps({"command": "ls", "timeout": 5})}))
    assert parse_action(as_string) == Action("bash", "ls", 5)
    assert parse_action(call('{"name": "bash", "arguments": {"command": "ls", "timeout": "30"}}')).timeout == 30
    assert parse_action(call('{"name": "bash", "arguments": {"command": "ls", "timeout": null}}')) == Action("bash", "ls")
    assert parse_action(call('\n {"name": "done"} \n')) == Action("done")
    assert parse_action(call('{"arguments": {}, "name": "done"}')) == Action("done")
    # the first call counts; text around it is ignored
    assert parse_action("Listing.\n" + JSON_LS + render_done(form="json")) == Action("bash", "ls -la")


@pytest.mark.parametrize("body, message", [
    ('{"name": "bash", "arguments": {"command": "ls"}', chat.BAD_JSON),
    ('{"name": "bash", "arguments": {"command": "ls"}} trailing', chat.BAD_JSON),
    ("{'name': 'bash'}", chat.BAD_JSON),
    ('{"name": "bash", "arguments": {"command": "a\nb"}}', chat.BAD_JSON),  # raw newline in a JSON string
    ('{"name": "bash", "arguments": "{not json"}', chat.BAD_JSON),
    ("[1]", chat.EXPECTED_FUNCTION),  # not an object: neither form
    ('{"a": ' * 100000 + "1" + "}" * 100000, chat.BAD_JSON),  # too deep for the decoder
    ('{"name": "bash", "name": "done"}', chat.DUPLICATE_KEY),
    ('{"name": "bash", "arguments": {"command": "ls", "command": "pwd"}}', chat.DUPLICATE_KEY),
    ('{"function": "bash"}', chat.EXPECTED_JSON),
    ('{"name": "bash", "arguments": {"command": "ls"}, "id": 1}', chat.EXPECTED_JSON),
    ('{"name": 7, "arguments": {}}', chat.EXPECTED_JSON),
    ('{"name": "bash", "arguments": ["ls"]}', chat.EXPECTED_JSON),
    ('{"name": "bash", "arguments": "[1]"}', chat.EXPECTED_JSON),
    ('{"name": "python", "arguments": {"code": "1"}}', chat.UNKNOWN_FUNCTION),
    ('{"name": "done", "arguments": {"reason": "ok"}}', chat.DONE_TAKES_NO_PARAMETERS),
    ('{"name": "bash", "arguments": {}}', chat.MISSING_COMMAND),
    ('{"name": "bash"}', chat.MISSING_COMMAND),
    ('{"name": "bash", "arguments": {"command": ["ls"]}}', chat.COMMAND_NOT_STRING),
    ('{"name": "bash", "arguments": {"command": 1}}', chat.COMMAND_NOT_STRING),
    ('{"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}', chat.UNKNOWN_PARAMETER),
    ('{"name": "bash", "arguments": {"command": "  "}}', chat.EMPTY_COMMAND),
    ('{"name": "bash", "arguments": {"command": "echo a\\u0000b"}}', chat.NUL_IN_COMMAND),
    ('{"name": "bash", "arguments": {"command": "echo \\ud800"}}', chat.SURROGATE_IN_COMMAND),
])
def test_json_malformed(body, message):
    form = "" if message == chat.EXPECTED_FUNCTION else "json"
    assert parse_action(call(body)) == err(message, form)
    assert parse_action(call(body)).form == form


@pytest.mark.parametrize("timeout", ["0", "601", "-5", "1.5", "abc", "", "10000000000"])
def test_json_bad_timeout(timeout):
    for value in (timeout, *([] if not timeout.lstrip("-").isdigit() else [int(timeout)])):
        text = call(json.dumps({"name": "bash", "arguments": {"command": "ls", "timeout": value}}))
        assert parse_action(text) == err(chat.BAD_TIMEOUT)
    for value in (1.5, 30.0, True, [30]):
        text = call(json.dumps({"name": "bash", "arguments": {"command": "ls", "timeout": value}}))
        assert parse_action(text) == err(chat.BAD_TIMEOUT)


def test_json_command_length_limit():
    long = render_bash("x" * 11, form="json")
    assert parse_action(long, max_command_chars=10) == err(chat.command_too_long(10))


def test_a_call_in_neither_form_is_worded_for_the_taught_one():
    for body in ("", "ls -la", "bash ls", "<function bash>"):
        assert parse_action(call(body)) == err(chat.EXPECTED_FUNCTION)
        assert parse_action(call(body), tool_format="json") == err(chat.EXPECTED_JSON)
    # a broken call in a recognisable form keeps that form's message whatever is taught
    broken_xml = "<tool_call><function=bash><parameter=command>ls</function></tool_call>"
    assert parse_action(broken_xml, tool_format="json") == err(chat.UNCLOSED_PARAMETER)
    assert parse_action(broken_xml, tool_format="json").form == "xml"
    assert parse_action(call("{oops"), tool_format="xml") == err(chat.BAD_JSON)


# ---------------------------------------------------------------------------- reasoning blocks


def test_a_call_quoted_in_reasoning_does_not_count():
    for form in ("xml", "json"):
        quoted = render_bash("rm -rf /", form=form)
        text = f"<think>\nMaybe {quoted}? No.\n</think>\n\n" + render_bash("ls", form=form)
        assert parse_action(text) == Action("bash", "ls")
        # the empty block of a non-thinking turn, and the history's "assistant\n" before it
        assert parse_action("assistant\n<think>\n\n</think>\n\n" + render_bash("ls", form=form)) == Action("bash", "ls")
    assert parse_action("<think>\nI will call " + render_done() + "\n</think>\n\n") == err(chat.NO_TOOL_CALL)
    # a generation cut inside its reasoning has no call, even if the reasoning spelled one out
    assert parse_action("<think>\nI'll run " + render_bash("ls")) == err(chat.UNCLOSED_THINK)
    # <think> inside a call's value is just text
    assert parse_action(render_bash("echo '<think>'", form="json")) == Action("bash", "echo '<think>'")
    assert parse_action(render_bash("echo '<think>'")) == Action("bash", "echo '<think>'")


# ---------------------------------------------------------------------------- system prompts


def test_system_prompt_follows_the_taught_form():
    assert system_prompt() == system_prompt("xml") == xml_description()
    xml, js = system_prompt("xml"), system_prompt("json")
    assert chat.render_bash("ls -la") in xml and "<tool_call>" in xml
    assert js.startswith(JSON_SYSTEM + "\n\n# Tools\n\n") and js.endswith("</tool_call>")
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in js and "<function=" not in js
    for tool in TOOL_SCHEMAS:  # each schema, compact, on its own line, in order
        assert "\n" + json.dumps(tool, ensure_ascii=False) + "\n" in js
    assert [t["function"]["name"] for t in TOOL_SCHEMAS] == ["bash", "done"]
    bash = TOOL_SCHEMAS[0]["function"]["parameters"]
    assert set(bash["properties"]) == {"command", "timeout"} and bash["required"] == ["command"]
    with pytest.raises(ValueError, match="tool_format"):
        system_prompt("yaml")
