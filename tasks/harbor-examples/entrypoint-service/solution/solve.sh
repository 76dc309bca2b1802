#!/bin/bash
python3 - <<'PY'
import time
import urllib.error
import urllib.request

base = "http://127.0.0.1:9000/kv/"
deadline = time.monotonic() + 120  # the image's service may still be starting on a loaded machine
while True:
    try:
        token = urllib.request.urlopen(base + "token", timeout=10).read().decode()
        break
    except (urllib.error.URLError, ConnectionError):
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
open("/app/token.txt", "w").write(token + "\n")
urllib.request.urlopen(urllib.request.Request(base + "answer", data=token.encode(), method="PUT"), timeout=10)
print("stored")
PY
