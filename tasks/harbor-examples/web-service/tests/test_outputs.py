"""The agent's HTTP server is still up and serves the status file it wrote."""

import json
import urllib.request


def fetch(path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:8080{path}", timeout=10) as response:
        return response.read()


def test_status_is_served():
    assert json.loads(fetch("/status.json")) == {"ok": True, "version": "2.4.1"}


def test_the_site_is_served_as_it_was():
    assert fetch("/index.html") == b"<h1>status page</h1>\n"
