"""What the system prompt says about the tools, in the call form the recipe teaches.

    system_prompt("xml")    the Qwen3-Coder XML description (the tiny kit's, unchanged)
    system_prompt("json")   Qwen3's own tools block, as its chat template writes it

`policy.tool_format` picks one; `obsspec/chat.py` parses calls in either form whichever is
taught. The JSON prompt is, character for character, what Qwen3's chat template renders for
`apply_chat_template([{"role": "system", "content": JSON_SYSTEM}, ...], tools=TOOL_SCHEMAS)`:

    {JSON_SYSTEM}\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user
    query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n
    <tools>\\n{schema 1 as compact JSON}\\n{schema 2}\\n</tools>\\n\\nFor each function call, return a
    json object with function name and arguments within <tool_call></tool_call> XML tags:\\n
    <tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>

(the template's `tojson` is `json.dumps(..., ensure_ascii=False)`, keys in the order given).
tests/test_qwen3_layout.py checks it against a template written from that layout.
"""

from __future__ import annotations

import json

from obsspec.chat import CALL_CLOSE, MAX_TIMEOUT_S, PARAM_CLOSE, TOOL_FORMATS, render_bash, render_done


def xml_description() -> str:
    """The fixed text that tells the policy its tools and the XML call format."""
    return f"""You work in a Linux terminal through tools. Call exactly one tool per reply, like this:

{render_bash("ls -la")}

Tools:
- bash(command, timeout): runs `command` in a persistent bash shell (the working directory and
  variables carry over between calls). `timeout` is optional: whole seconds, 1 to {MAX_TIMEOUT_S}.
  The result is the combined stdout and stderr (cut if long) followed by (exit_code=N).
- done(): call it, with no parameters, when the task is complete; it ends the episode:

{render_done()}

Only the first tool call in a reply is used. A parameter value cannot contain the text
{PARAM_CLOSE} or {CALL_CLOSE}."""


# The system message's own text in the JSON form; the tools themselves are in the schemas.
JSON_SYSTEM = ("You work in a Linux terminal through tools. Call exactly one tool per reply (only the "
               "first tool call in a reply is used), and call done when the task is complete.")

# In the function-calling layout that chat templates take as `tools=`.
TOOL_SCHEMAS = (
    {"type": "function", "function": {
        "name": "bash",
        "description": ("Run a command in a persistent bash shell (the working directory and variables "
                        "carry over between calls). The result is the combined stdout and stderr (cut if "
                        "long) followed by (exit_code=N)."),
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command to run."},
            "timeout": {"type": "integer",
                        "description": f"Optional: whole seconds, 1 to {MAX_TIMEOUT_S}."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "done",
        "description": "End the episode: call it, with no arguments, when the task is complete.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
)


def json_description() -> str:
    """Qwen3's tools block for JSON_SYSTEM and TOOL_SCHEMAS (see the module docstring)."""
    schemas = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in TOOL_SCHEMAS)
    return (f"{JSON_SYSTEM}\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
            "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{schemas}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def system_prompt(tool_format: str = "xml") -> str:
    """The system message's content for the taught call form."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
    return json_description() if tool_format == "json" else xml_description()
