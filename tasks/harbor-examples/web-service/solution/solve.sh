#!/bin/bash
cd /app
printf '{"ok": true, "version": "%s"}\n' "$(cat VERSION)" > site/status.json
nohup python3 -m http.server 8080 --bind 127.0.0.1 --directory /app/site > /tmp/http.log 2>&1 &
# wait until it answers
for i in $(seq 50); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8080/")' 2>/dev/null && break; sleep 0.1; done
echo serving
