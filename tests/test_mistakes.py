"""obsspec/env/mistakes.py: one edit per command, the kinds a sampled policy makes."""

from __future__ import annotations

import random

from obsspec.env.mistakes import EDITS, _edit, mistake, with_mistake

COMMAND = "cat data/* | wc -w > answer.txt"


def test_each_edit_kind_does_what_it_says():
    words = COMMAND.split()
    rng = random.Random(0)
    for kind in EDITS:
        for _ in range(20):
            got = _edit(words, kind, rng)
            if kind == "duplicate":
                assert len(got) == len(words) + 1 and sorted(set(got)) == sorted(set(words))
            elif kind == "delete":
                assert len(got) == len(words) - 1 and set(got) <= set(words)
            elif kind in ("swap", "replace"):
                assert len(got) == len(words) and set(got) <= set(words)
                assert kind == "replace" or sorted(got) == sorted(words)
            else:  # typo: one word one character shorter (a one-character word cannot be: unchanged)
                assert len(got) == len(words) and len(" ".join(got)) in (len(COMMAND) - 1, len(COMMAND))


def test_a_mistake_changes_the_command_and_is_seeded():
    for seed in range(50):
        assert mistake(COMMAND, random.Random(seed)) != COMMAND
        assert mistake(COMMAND, random.Random(seed)) == mistake(COMMAND, random.Random(seed))
    assert len({mistake(COMMAND, random.Random(s)) for s in range(50)}) > 20
    # the doubled redirect and the doubled pipe a policy writes are among them
    made = {mistake(COMMAND, random.Random(s)) for s in range(400)}
    assert "cat data/* | wc -w > > answer.txt" in made and "cat data/* | | wc -w > answer.txt" in made


def test_edge_cases_never_raise():
    assert mistake("", random.Random(0)) == ""
    assert mistake("l", random.Random(0)) in ("l l", "", "l")  # duplicated, or deleted (then kept)
    assert with_mistake([], random.Random(0)) == []
    solution = ["ls -l data", COMMAND, "cat answer.txt"]
    for seed in range(30):
        got = with_mistake(solution, random.Random(seed))
        assert len(got) == 3 and sum(a != b for a, b in zip(got, solution)) == 1
