"""The token-level chat layout shared by the policy, the world model, rollouts and SFT.

A trajectory is kept as token ids from its first token to its last and is never re-tokenized from
text; this module says which ids go where. The layout is Qwen3's (ChatML), with the observation
in a user turn wrapped in `<tool_response>` as Qwen3's chat template does it. GEN is the
generation prompt: "<|im_start|>assistant\\n" with `thinking` on (Qwen3's default: the model
may open its own `<think>` block), "<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n" with it off
(what Qwen3's template writes for enable_thinking=False):

    prompt_ids(instruction)       "<|im_start|>system\\n{tools}<|im_end|>\\n"
                                  "<|im_start|>user\\n{instruction}<|im_end|>\\n" + GEN  (one encode)
    action (the policy's output)  "<tool_call>...</tool_call>" + "<|im_end|>"       (generated;
                                  `<|im_end|>` is the stop token and belongs to the action)
    observation_ids(body)         OBS_PREFIX = "\\n<|im_start|>user\\n" + chat.OBS_OPEN
                                  + body
                                  + chat.OBS_CLOSE + after_obs
                                  where after_obs = "<|im_end|>\\n" + GEN

with chat.OBS_OPEN = "<tool_response>\\n" and chat.OBS_CLOSE = "\\n</tool_response>", so the
observation reads "\\n<|im_start|>user\\n<tool_response>\\n{body}\\n</tool_response><|im_end|>\\n
<|im_start|>assistant\\n" (+ the empty think block with thinking off). {tools} is
`tool_prompt.system_prompt(tool_format)`. The "\\n" after an action's `<|im_end|>` is the first
observation token (the policy never generates it). The four pieces OBS_PREFIX, body, OBS_CLOSE
and after_obs are encoded SEPARATELY and concatenated, so:
- the body's ids are exactly `encode(body)`, whatever it starts or ends with; speculation
  compares these ids (docs/ROLLOUT.md, "One turn");
- the world model's prompt is `history + action + encode(OBS_PREFIX)` and its target is
  `encode(body) + encode(OBS_CLOSE)`, which is token for token what the policy sees next.
Where that differs from Qwen3's template (which encodes each turn as one text), and how earlier
turns' think blocks compare: docs/CHAT.md, "Against Qwen3's chat template".
A malformed call gets `observation_ids(chat.error_observation(message))`: the same wrapper.
A `done()` call ends the episode; nothing follows its `<|im_end|>`.

    fmt = ChatFormat(tokenizer)                      # or ChatFormat(tok, **recipe.policy.chat_layout)
    ids = fmt.prompt_ids(task.instruction)
    ids += fmt.action_ids(fmt.render_bash("ls"))
    obs, body = fmt.observation_ids("a.txt\\n\\n(exit_code=0)")
    assert obs[body] == fmt.encode_text("a.txt\\n\\n(exit_code=0)")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from obsspec import chat
from obsspec.tool_prompt import system_prompt

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
OBS_PREFIX = f"\n{IM_START}user\n{chat.OBS_OPEN}"
EMPTY_THINK = f"{chat.THINK_OPEN}\n\n{chat.THINK_CLOSE}\n\n"
AFTER_OBS = f"{IM_END}\n{IM_START}assistant\n"  # (thinking on: the tiny kit's layout)


def generation_prompt(thinking: bool = True) -> str:
    """Where each policy turn starts: Qwen3's generation prompt for enable_thinking on / off."""
    return f"{IM_START}assistant\n" + ("" if thinking else EMPTY_THINK)


def prompt_text(instruction: str, *, thinking: bool = True, tool_format: str = "xml") -> str:
    """The prompt as text (what `apply_chat_template` gives for [system, user] + generation prompt)."""
    return (f"{IM_START}system\n{system_prompt(tool_format)}{IM_END}\n"
            f"{IM_START}user\n{instruction}{IM_END}\n{generation_prompt(thinking)}")


class ChatFormat:
    """Token ids of every piece of a trajectory, for one tokenizer (a transformers tokenizer) and
    one layout: `thinking` and `tool_format` are the recipe's policy keys (PolicyConfig.chat_layout)."""

    def __init__(self, tokenizer, *, thinking: bool = True, tool_format: str = "xml"):
        if tool_format not in chat.TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {chat.TOOL_FORMATS}, got {tool_format!r}")
        self.tokenizer = tokenizer
        self.thinking, self.tool_format = bool(thinking), tool_format
        self.im_end_id = self._single_token(IM_END)
        self.im_start_id = self._single_token(IM_START)
        self.obs_prefix_ids = self.encode(OBS_PREFIX)
        self.obs_close_ids = self.encode(chat.OBS_CLOSE)
        self.after_obs_ids = self.encode(IM_END + "\n" + generation_prompt(self.thinking))
        close_tag = self.encode("</tool_response>")
        # The world model stops on `</tool_response>`: on its token where it is one, else on the text.
        self.wm_stop_token_ids: tuple[int, ...] = tuple(close_tag) if len(close_tag) == 1 else ()
        self.wm_stop_strings: tuple[str, ...] = () if self.wm_stop_token_ids else (chat.OBS_CLOSE,)

    def _single_token(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer must encode {text!r} as one token, got {ids}")
        return ids[0]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_text(self, text: str) -> list[int]:
        """Text from the environment (command output, file contents): `<|im_end|>` in it is text,
        never the special token, so output cannot forge a turn boundary in the policy's context
        (a file holding `<|im_end|>\n<|im_start|>assistant\n...` made a turn identical to a
        real one)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    # ---- the pieces --------------------------------------------------------------------------

    def prompt_ids(self, instruction: str) -> list[int]:
        return self.encode(prompt_text(instruction, thinking=self.thinking, tool_format=self.tool_format))

    def action_ids(self, text: str) -> list[int]:
        """A scripted action (e.g. `fmt.render_bash(cmd)`) as the policy would emit it: + <|im_end|>."""
        return self.encode(text) + [self.im_end_id]

    def render_bash(self, command: str, timeout: int | None = None) -> str:
        """A bash call in the form the prompt teaches."""
        return chat.render_bash(command, timeout, form=self.tool_format)

    def render_done(self) -> str:
        return chat.render_done(form=self.tool_format)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """What ends a policy turn."""
        return (self.im_end_id,)

    def observation_ids(self, body: str) -> tuple[list[int], slice]:
        """The tokens appended after an action, and where the body's ids sit among them."""
        body_ids = self.encode_text(body)
        start = len(self.obs_prefix_ids)
        ids = self.obs_prefix_ids + body_ids + self.obs_close_ids + self.after_obs_ids
        return ids, slice(start, start + len(body_ids))

    def error_observation_ids(self, message: str) -> tuple[list[int], slice]:
        return self.observation_ids(chat.error_observation(message))

    def wm_prompt_ids(self, history_ids: Sequence[int], action_ids: Sequence[int] = (),
                      snapshot_ids: WorldView | Sequence[int] = ()) -> list[int]:
        """What the world model sees: history + action + the observation opening, in the task's
        `WorldView` (its workspace snapshot ahead, its hints after each call, when the recipe
        gives them; a plain id sequence is a snapshot alone). The one construction of the world
        model's prompt: the scheduler's requests, evaluation cases and (through the same layout,
        `transcript` and `wm_row`) training rows."""
        return wm_context(snapshot_ids, [*history_ids, *action_ids, *self.obs_prefix_ids])

    def calls(self, ids: Sequence[int]) -> list[tuple[int, str]]:
        """(position right after the action's `<|im_end|>`, the action's text) for every action of
        `ids` that an observation opening follows: where a hint goes (`WorldView`). Only an
        action's end is `<|im_end|>` + the opening: environment text never holds the special
        token (`encode_text`), and a generation ends at its first `<|im_end|>`."""
        out, n, start = [], len(self.obs_prefix_ids), 0
        ids = list(ids)
        for i, t in enumerate(ids):
            if t == self.im_start_id:
                start = i + 1
            elif t == self.im_end_id and ids[i + 1:i + 1 + n] == self.obs_prefix_ids:
                out.append((i + 1, self.decode(ids[start:i + 1])))
        return out

    # -- the exact-match test -------------------------------------------------------------------
    def draft_observation_ids(self, draft_body: str, cap: int) -> tuple[str, list[int], slice]:
        """A draft as the policy would see it: normalised, truncated at `cap` and encoded exactly
        as a real observation (-> body, observation ids, where the body sits among them)."""
        body = chat.normalize_draft(draft_body, cap=cap)
        ids, span = self.observation_ids(body)
        return body, ids, span

    def is_hit(self, draft_body_ids: Sequence[int], real_body: str) -> bool:
        """Exact means exact: the draft's body ids (from `draft_observation_ids`) equal those of
        the real observation after the same encoding. The one hit test, of the scheduler and of
        every evaluation."""
        ids, span = self.observation_ids(real_body)
        return list(draft_body_ids) == ids[span]

    def draft_hits(self, draft_body: str | None, real_body: str, cap: int) -> bool:
        """`is_hit` for a raw draft body (None: the world model produced no usable draft)."""
        if draft_body is None:
            return False
        _, ids, span = self.draft_observation_ids(draft_body, cap)
        return self.is_hit(ids[span], real_body)

    def wm_target_ids(self, body: str) -> list[int]:
        """What the world model is trained to write: body + closing tag (it stops there)."""
        return self.encode_text(body) + self.obs_close_ids

    def parse(self, text: str) -> chat.Action:
        """A policy turn's text as an action (either call form; errors worded for the taught one)."""
        return chat.parse_action(text, tool_format=self.tool_format)

    def parse_action(self, action_ids: Sequence[int]) -> chat.Action:
        return self.parse(self.decode(action_ids))


@dataclass(frozen=True)
class WorldView:
    """What the world model reads besides the rollout's own ids, for one task: `prefix`, its
    workspace snapshot ahead of the context (obsspec/worldmodel/snapshot.py; empty when
    `world_model.workspace_snapshot` is off), and `hint`, command -> ids put right after each
    bash call of the context (obsspec/worldmodel/hints.py; None when `world_model.hint_tokens` is
    0). Both are functions of the task's initial workspace and of the ids alone, so a history's
    layout is the same whenever it is rebuilt: in a draft's prompt and in a training row."""

    prefix: tuple[int, ...] = ()
    fmt: ChatFormat | None = None
    hint: Callable[[str], Sequence[int]] | None = None

    def layout(self, ids: Sequence[int], mask: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
        """`ids` in this view, and `mask` (e.g. a row's `wm_mask`) with 0 on everything added."""
        ids, mask = list(ids), list(mask) if mask is not None else [0] * len(ids)
        out_ids, out_mask, at = [*self.prefix], [0] * len(self.prefix), 0
        if self.hint is not None:
            for pos, action in self.fmt.calls(ids):
                parsed = self.fmt.parse(action)
                extra = list(self.hint(parsed.command)) if parsed.kind == "bash" else []
                out_ids += ids[at:pos] + extra
                out_mask += mask[at:pos] + [0] * len(extra)
                at = pos
        return out_ids + ids[at:], out_mask + mask[at:]


def as_view(view: WorldView | Sequence[int]) -> WorldView:
    """A `WorldView`; a plain id sequence is a workspace snapshot alone."""
    return view if isinstance(view, WorldView) else WorldView(tuple(view))


def wm_context(view: WorldView | Sequence[int], context_ids: Sequence[int]) -> list[int]:
    """The world model's input: the rollout's own token ids in the task's `WorldView` (a plain
    id sequence: the workspace snapshot ahead). The one construction shared by the rollout's
    predictor, training rows and evaluation cases."""
    return as_view(view).layout(context_ids)[0]


def wm_row(view: WorldView | Sequence[int], ids: Sequence[int], wm_mask: Sequence[int]) -> dict:
    """A world-model SFT row `{"input_ids", "completion_mask"}`: `wm_context` of the ids, loss
    where `wm_mask` is 1 (never on the snapshot or a hint)."""
    ids, mask = as_view(view).layout(ids, wm_mask)
    return {"input_ids": ids, "completion_mask": mask}


# ---------------------------------------------------------------------------------------------
# Whole reference trajectories (for supervised warm starts and world-model pre-training)


@dataclass
class Transcript:
    """A trajectory laid out in tokens, with two masks over `ids` (1 = counted in that loss).

    `action_mask`: the policy's tokens (each action with its <|im_end|>); `wm_mask`: each
    observation body plus its closing tag, i.e. exactly the world model's target at that turn
    (a causal LM sees history + action + opening before it, as `wm_prompt_ids` builds them).
    """

    ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    wm_mask: list[int] = field(default_factory=list)

    def add(self, ids: Sequence[int], action: int = 0, wm: int = 0) -> None:
        self.ids += ids
        self.action_mask += [action] * len(ids)
        self.wm_mask += [wm] * len(ids)


def transcript(fmt: ChatFormat, instruction: str, steps: Sequence[tuple[str, str]],
               done: bool = True) -> Transcript:
    """Prompt, then per (command, body) step the bash call and its observation, then `done()`."""
    t = Transcript()
    t.add(fmt.prompt_ids(instruction))
    for command, body in steps:
        t.add(fmt.action_ids(fmt.render_bash(command)), action=1)
        t.add(fmt.obs_prefix_ids)
        t.add(fmt.wm_target_ids(body), wm=1)
        t.add(fmt.after_obs_ids)
    if done:
        t.add(fmt.action_ids(fmt.render_done()), action=1)
    return t
