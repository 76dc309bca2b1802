#!/bin/bash
python3 - <<'PY'
import urllib.request

base = "http://127.0.0.1:9000/kv/"
token = urllib.request.urlopen(base + "token", timeout=10).read().decode()
open("/app/token.txt", "w").write(token + "\n")
urllib.request.urlopen(urllib.request.Request(base + "answer", data=token.encode(), method="PUT"), timeout=10)
print("stored")
PY
