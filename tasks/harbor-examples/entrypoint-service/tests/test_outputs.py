"""The image's service is up, and the agent copied its token to a file and back into it."""

import urllib.request

TOKEN = "cd8124d7ea294afb"  # sha256 of the image's seed, first 16 hex digits


def test_the_token_was_written_to_the_file():
    assert open("/app/token.txt").read().strip() == TOKEN


def test_the_service_holds_the_answer():
    with urllib.request.urlopen("http://127.0.0.1:9000/kv/answer", timeout=10) as response:
        assert response.read().decode() == TOKEN
