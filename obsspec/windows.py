"""World-model rows that fit a token budget: a long episode cut into windows, targets kept whole.

    rows, dropped = fit(row, max_length=16384, head=len(view.prefix))

A row is `{"input_ids", "completion_mask"}` over a whole episode (obsspec/tokens.py `wm_row`):
the world model's targets are its observation bodies + closing tags (mask 1), and one causal
pass trains every (context -> observation) pair of it at once. A 32-turn episode of a GPU recipe
runs to 32k tokens, past what co-training can afford per row (`wm_train.max_length`); dropping
such an episode would teach the world model only the short ones. So a row longer than the budget
becomes windows:

- a window ends where a target ends and is at most `max_length` tokens; its first `head` tokens
  (the workspace snapshot, when the world model reads one) are the row's own, the rest the
  episode's latest tokens before that end: the context is cut from the left, never the target;
- every target is trained once, in a window that gives it at least half the budget as context,
  or everything before it when the episode is shorter there (windows are built from the last
  target back: each takes the targets it holds with that much context; the rest start the next);
- a target longer than the budget alone (less the head) cannot be trained whole: dropped, counted.

So windows overlap by about half: an episode of L tokens costs ~2L tokens of training, not L x
turns as one row per observation would. The world model then learns each observation from up
to `max_length` tokens of history (its latest turns, the command, the snapshot), while at draft
time it reads the whole history: a context longer than the budget is one it was trained on
only in part. A row within the budget is returned as it is.
"""

from __future__ import annotations


def targets(mask) -> list[tuple[int, int]]:
    """The runs of 1 in `mask` as [start, end) pairs."""
    out, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out


def fit(row: dict, max_length: int, head: int = 0) -> tuple[list[dict], int]:
    """`row` as rows of at most `max_length` tokens (the first `head` tokens ahead of each), and
    how many of its targets were too long to fit alone. A row without a target gives none."""
    ids, mask = row["input_ids"], row["completion_mask"]
    if len(ids) <= max_length:
        return ([row] if any(mask) else []), 0
    room = max_length - head
    if room < 1:
        raise ValueError(f"a head of {head} tokens leaves no room in max_length = {max_length}")
    body, body_mask = ids[head:], mask[head:]
    spans = targets(body_mask)
    pending = [s for s in spans if s[1] - s[0] <= room]
    half, windows = room // 2, []
    while pending:
        end = pending[-1][1]
        start = max(0, end - room)
        taken = [s for s in pending if s[0] >= start and (start == 0 or s[0] - start >= half or s == pending[-1])]
        window_mask = [0] * (end - start)
        for a, b in taken:
            window_mask[a - start:b - start] = [1] * (b - a)
        windows.append({"input_ids": list(ids[:head]) + list(body[start:end]),
                        "completion_mask": [0] * head + window_mask})
        pending = [s for s in pending if s not in taken]
    return windows[::-1], len(spans) - sum(1 for s in spans if s[1] - s[0] <= room)
