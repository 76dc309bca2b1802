"""Chat fidelity: obsspec's prompt ids against Qwen3's chat template, token for token.

A tokenizer with Qwen3's pre-tokenizer and its special tokens at Qwen3's ids (a small byte-level
BPE, its vocabulary padded up to 151643: obsspec/models/qwen3_standin.py) and a Jinja template
written from Qwen3's documented layout (system + tools block, tool calls as JSON in <tool_call>,
tool results as user turns in <tool_response>, think blocks kept after the last user query,
enable_thinking's empty block), run through transformers' `apply_chat_template`. Where obsspec departs from the template on
purpose, the test says exactly how (docs/CHAT.md, "Against Qwen3's chat template").

Run: .venv/bin/python -m pytest -q tests/test_qwen3_layout.py
"""

from __future__ import annotations

import pytest

from obsspec import chat
from obsspec.models.qwen3_standin import QWEN3_IDS, qwen3_tokenizer
from obsspec.tokens import EMPTY_THINK, ChatFormat
from obsspec.tool_prompt import JSON_SYSTEM, TOOL_SCHEMAS, system_prompt

# Written from Qwen3's documented chat format, not taken from its file.
TEMPLATE = (
    "{%- set sys = messages[0].role == 'system' %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}{%- if sys %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments'"
    " + ' within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif sys %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    # think blocks survive only after the last real user query (tool results are not queries)
    "{%- set ns = namespace(query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' and not (m.content.startswith('<tool_response>')"
    " and m.content.endswith('</tool_response>')) %}{%- set ns.query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}"
    "{%- if m.reasoning_content is not string and '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- for call in m.tool_calls or [] %}"
    "{%- set f = call.function if call.function else call %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{{- f.arguments if f.arguments is string else (f.arguments | tojson) }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

INSTRUCTION = "Count the lines of data/notes.txt and write the number to count.txt."
COMMANDS = ["wc -l data/notes.txt", "cat <<'EOF' > count.txt\n3\nEOF"]
# Bodies whose edges do not merge with the wrapper's newlines (see test_observation_seams_...).
PLAIN_BODIES = ["3 data/notes.txt", "no output here"]
REASONING = ["The file is small; count it first.", "Now write the number."]
LAYOUTS = [(thinking, form) for thinking in (True, False) for form in ("xml", "json")]


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [system_prompt("xml"), system_prompt("json"), INSTRUCTION, *COMMANDS, *PLAIN_BODIES, *REASONING,
              "hello\n\n(exit_code=0)\n", "(no output)\n(exit_code=1)\n", "\n\n\nx\n"] * 3
    fast = qwen3_tokenizer(corpus, chat_template=TEMPLATE)
    assert {t: fast.convert_tokens_to_ids(t) for t in QWEN3_IDS} == QWEN3_IDS
    assert ")\n" in {fast.decode([i]) for i in range(600)}, "the seams test needs Qwen3's ')\\n' token"
    return fast


def conversation(form: str, thinking: bool, commands=COMMANDS, bodies=PLAIN_BODIES) -> tuple[list, dict]:
    """The messages an agent framework would hand the template for our episode, and its kwargs."""
    system = JSON_SYSTEM if form == "json" else system_prompt("xml")
    messages = [{"role": "system", "content": system}, {"role": "user", "content": INSTRUCTION}]
    for command, body, reasoning in zip(commands, bodies, REASONING):
        turn = {"role": "assistant", "content": chat.render_bash(command)}
        if form == "json":  # a parsed call, rendered by the template itself
            turn = {"role": "assistant", "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}]}
        if thinking:
            turn["reasoning_content"] = reasoning
        messages += [turn, {"role": "tool", "content": body}]
    kwargs = {"tools": list(TOOL_SCHEMAS) if form == "json" else None, "enable_thinking": thinking}
    return messages, kwargs


def ours(fmt: ChatFormat, commands=COMMANDS, bodies=PLAIN_BODIES) -> list[int]:
    """The trajectory obsspec builds: prompt, then per step the generated action and its observation."""
    ids = fmt.prompt_ids(INSTRUCTION)
    for command, body, reasoning in zip(commands, bodies, REASONING):
        think = f"<think>\n{reasoning}\n</think>\n\n" if fmt.thinking else ""  # (a thinking model writes it)
        ids += fmt.action_ids(think + fmt.render_bash(command)) + fmt.observation_ids(body)[0]
    return ids


def template_ids(tokenizer, messages, **kwargs) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
    return list(out["input_ids"])


@pytest.mark.parametrize("thinking, form", LAYOUTS)
def test_the_prompt_is_the_templates_token_for_token(tokenizer, thinking, form):
    fmt = ChatFormat(tokenizer, thinking=thinking, tool_format=form)
    messages, kwargs = conversation(form, thinking, commands=[])
    assert fmt.prompt_ids(INSTRUCTION) == template_ids(tokenizer, messages, **kwargs)
    assert fmt.decode(fmt.prompt_ids(INSTRUCTION)).endswith("<|im_start|>assistant\n" + ("" if thinking else
                                                                                         EMPTY_THINK))


@pytest.mark.parametrize("form", ["xml", "json"])
def test_a_thinking_episode_is_the_templates_token_for_token(tokenizer, form):
    """Thinking on: every turn after the instruction keeps its think block in the template too, so
    appending the generated ids gives exactly the template's rendering of the episode so far."""
    fmt = ChatFormat(tokenizer, thinking=True, tool_format=form)
    messages, kwargs = conversation(form, thinking=True)
    assert ours(fmt) == template_ids(tokenizer, messages, **kwargs)


@pytest.mark.parametrize("form", ["xml", "json"])
def test_without_thinking_earlier_turns_keep_their_empty_think_block(tokenizer, form):
    """Thinking off: each turn was generated after `<think>\\n\\n</think>\\n\\n` and obsspec keeps
    those ids; the template drops an empty think block from every assistant turn but the last. That
    block is the only difference: inserted into the template's text, the ids are the same."""
    fmt = ChatFormat(tokenizer, thinking=False, tool_format=form)
    messages, kwargs = conversation(form, thinking=False)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    turn = "<|im_start|>assistant\n"
    assert text.count(turn + EMPTY_THINK) == 1, "the template keeps it in the generation prompt only"
    with_blocks = text.replace(turn + "<tool_call>", turn + EMPTY_THINK + "<tool_call>")
    assert ours(fmt) == fmt.encode(with_blocks)
    assert ours(fmt) != template_ids(tokenizer, messages, **kwargs)
    first_turn = ours(fmt, commands=[], bodies=[])
    assert first_turn == template_ids(tokenizer, messages[:2], **kwargs), "the first prompt is exact"


@pytest.mark.parametrize("form", ["xml", "json"])
def test_observation_seams_split_where_the_template_would_merge(tokenizer, form):
    """A body is encoded on its own (drafts and real outputs are compared as ids), while the
    template encodes "\\n" + body + "\\n" as one text: Qwen3's split glues trailing punctuation to
    the newline after it, and a leading newline run to the wrapper's. So a bash body, which ends
    with ")", ends in ")" "\\n" where the template has the one token ")\\n"; text is the same."""
    fmt = ChatFormat(tokenizer, thinking=True, tool_format=form)
    messages, kwargs = conversation(form, thinking=True)
    for body in ("hello\n\n(exit_code=0)", "\n\nleading newlines\n(exit_code=1)"):
        messages[-1]["content"] = body
        mine = ours(fmt, bodies=[PLAIN_BODIES[0], body])
        theirs = template_ids(tokenizer, messages, **kwargs)
        assert fmt.decode(mine) == fmt.decode(theirs)
        assert mine != theirs
        start = len(mine) - len(fmt.observation_ids(body)[0]) + len(fmt.obs_prefix_ids) - 1
        seam = fmt.encode("\n" + body + "\n")  # the template's: one text between the tags
        our_seam = fmt.encode("\n") + fmt.encode_text(body) + fmt.encode("\n")
        assert theirs[start:start + len(seam)] == seam and mine[start:start + len(our_seam)] == our_seam
        assert theirs[:start] == mine[:start] and seam != our_seam
    assert fmt.encode(")\n") != fmt.encode(")") + fmt.encode("\n")


def test_observation_text_can_hold_the_tool_tokens_as_in_the_template(tokenizer):
    """`<tool_call>`, `</tool_response>`, `<think>` are added tokens that are not special in Qwen3:
    text from the environment encodes them as their single ids (as the template would), while
    `<|im_end|>` stays text, so output cannot close a turn."""
    fmt = ChatFormat(tokenizer)
    ids = fmt.encode_text("a</tool_response><|im_end|><think>")
    assert QWEN3_IDS["</tool_response>"] in ids and QWEN3_IDS["<think>"] in ids
    assert QWEN3_IDS["<|im_end|>"] not in ids
    assert fmt.wm_stop_token_ids == (QWEN3_IDS["</tool_response>"],)
