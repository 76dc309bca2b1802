"""A trajectory in tokens: ids from the prompt to the last token, with masks and logprobs.

Never re-tokenized from text: actions are the engine's token ids as generated, observations the
ids `ChatFormat.observation_ids` gives. Alongside `ids`:
- `policy_mask`  1 on tokens the policy generated (its loss and `env_mask` in TRL), 0 elsewhere;
- `wm_mask`      1 on observation bodies + closing tag (the world model's training target);
- `logprobs`     the sampled tokens' logprobs on policy tokens, 0.0 elsewhere.
`snapshot()` / `restore()` let the scheduler roll back a speculative extension.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence


@dataclass
class Turn:
    """What happened in one turn, in text (for people, traces and replay)."""

    action: str                 # the policy's decoded action
    kind: str                   # bash | done | error | truncated
    command: str = ""
    observation: str = ""       # the observation body appended after the action
    exit_code: int | None = None
    tool_sec: float = 0.0       # the tool's latency (real + emulated) for this turn
    spec: str = ""              # '' (not speculated) | match | rollback | exec_won | no_draft | skipped (busy)


@dataclass
class Trajectory:
    episode: int
    task_id: str
    prompt_len: int = 0
    ids: list[int] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    wm_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    infra_error: str = ""
    latency_sec: float = 0.0

    @classmethod
    def start(cls, episode: int, task_id: str, prompt_ids: Sequence[int]) -> "Trajectory":
        t = cls(episode, task_id, prompt_len=len(prompt_ids))
        t._add(prompt_ids)
        return t

    def _add(self, ids: Sequence[int], policy: int = 0, wm: Sequence[int] | None = None,
             logprobs: Sequence[float] | None = None) -> None:
        self.ids += ids
        self.policy_mask += [policy] * len(ids)
        self.wm_mask += list(wm) if wm is not None else [0] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def append_action(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self._add(ids, policy=1, logprobs=logprobs)

    def append_observation(self, ids: Sequence[int], body: slice, close_len: int,
                           target: bool = True) -> None:
        """Observation tokens; the body and the closing tag that follows it are the WM target
        (`target=False`: the fixed error observation of a malformed call, never a target)."""
        wm = [0] * len(ids)
        for i in range(body.start, min(len(ids), body.stop + close_len)) if target else ():
            wm[i] = 1
        self._add(ids, wm=wm)

    def snapshot(self) -> int:
        return len(self.ids)

    def restore(self, mark: int) -> None:
        for name in ("ids", "policy_mask", "wm_mask", "logprobs"):
            del getattr(self, name)[mark:]

    @property
    def completion_ids(self) -> list[int]:
        return self.ids[self.prompt_len:]

    def tokens_equal(self, other: "Trajectory") -> bool:
        return (self.ids, self.policy_mask, self.wm_mask) == (other.ids, other.policy_mask, other.wm_mask)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d["turns"]]
        return cls(**d)


def action_spans(policy_mask: Sequence[int]) -> list[tuple[int, int]]:
    """(tokens before it, its length) of each policy action: each run of 1s in a policy mask."""
    spans, prev = [], 0
    for i, m in enumerate(policy_mask):
        if m and not prev:
            spans.append([i, 0])
        if m:
            spans[-1][1] += 1
        prev = m
    return [(a, n) for a, n in spans]
