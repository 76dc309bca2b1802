"""A key-value store over HTTP, started by the image's CMD."""

import hashlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORE = {"token": hashlib.sha256(open("/opt/kv/seed", "rb").read()).hexdigest()[:16]}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        key = self.path.removeprefix("/kv/")
        if key not in STORE:
            self.send_error(404)
            return
        body = STORE[key].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        length = int(self.headers.get("Content-Length", 0))
        STORE[self.path.removeprefix("/kv/")] = self.rfile.read(length).decode()
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", 9000), Handler).serve_forever()
