"""The user's notes tool is configured (in the HOME the agent and the checks share)."""

import os
import subprocess


def test_the_note_is_listed_under_the_configured_author():
    out = subprocess.run(["notes", "list"], capture_output=True, text=True)
    assert out.stdout == "0001 Ada Lovelace <ada@example.org>: first steps\n", out.stderr


def test_the_notebook_is_in_home():
    assert os.listdir(os.path.expanduser("~/notebook")) == ["0001.txt"]
