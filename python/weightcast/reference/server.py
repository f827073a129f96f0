"""The reference engine's HTTP front: a threading HTTP/1.1 server that dispatches each request
from the route table (routes.py) to the engine and answers JSON.

Lifetime: serve() runs until interrupted. Threading: one thread per connection (daemon threads);
the handlers call the Engine, which takes its own locks.
"""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from .workers import WorkerError


class Handler(BaseHTTPRequestHandler):
    """One request: the route table's handler, its answer in the route's shape. Subclassed per
    server by make_handler(), which sets `engine` and `table`."""

    protocol_version = "HTTP/1.1"
    engine = None
    table = None

    def log_message(self, *args):
        pass

    def _answer(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, handlers, arg):
        path = urlparse(self.path).path
        fn = handlers.get(path)
        if self.command == "POST":
            self.engine.touch()
        if fn is None:
            return self._fail(404, f"no route {self.path}")
        try:
            out = fn(arg)
            self._answer(200, out if self.table.is_plain(path) else {"success": True, "message": "", **out})
        except WorkerError as e:
            self._fail(e.status, str(e))
        except (KeyError, ValueError, TypeError) as e:
            self._fail(400, f"bad request: {e!r}")

    def _fail(self, status, message):
        # vLLM's failures are FastAPI's {"detail": ...}; ours {"success": false, "message"}.
        self._answer(status, {"detail": message} if self.table.vllm else {"success": False, "message": message})

    def do_GET(self):
        self._serve(self.table.gets, parse_qs(urlparse(self.path).query))

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as e:
            return self._fail(400, f"body: {e}")
        for key, values in parse_qs(urlparse(self.path).query).items():
            body.setdefault(key, values[0])  # vLLM's query parameters (/pause?mode=...)
        self._serve(self.table.posts, body)


def make_handler(engine, table):
    return type("EngineHandler", (Handler,), {"engine": engine, "table": table})


def make_server(engine, table, host, port):
    server = ThreadingHTTPServer((host, port), make_handler(engine, table))
    server.daemon_threads = True
    return server
