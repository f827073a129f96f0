"""The reference engine's HTTP front: a threading HTTP/1.1 server that dispatches each request
from the route table (routes.py) to the engine and answers JSON, behind weightcast-engine's
guards (guard.py): the bearer token, the body-size limit and the read deadline.

Lifetime: make_server() binds; serve_forever() runs until interrupted. Threading: one thread per
connection (daemon threads) and one timer per request (its read deadline); the handlers call the
Engine, which takes its own locks.
"""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from . import guard
from .workers import WorkerError

_REFUSALS = {
    400: "Content-Length: not a byte count",
    411: "length required: send the body with a Content-Length",
    413: "payload too large: the body exceeds this engine's limit",
}


class Handler(BaseHTTPRequestHandler):
    """One request: the route table's handler, its answer in the route's shape. Subclassed per
    server by make_handler(), which sets the class attributes below."""

    protocol_version = "HTTP/1.1"
    # Keep-alive clients get each answer at once: headers and body are separate writes, and
    # with Nagle's algorithm the body waited on the client's delayed ACK (tens of ms).
    disable_nagle_algorithm = True
    engine = None
    table = None
    token = ""
    max_body_bytes = 64 << 20
    timeout = 30.0  # seconds: each socket read and write, and the whole request's arrival
    _body_unread = False

    def log_message(self, *args):
        pass

    # --- the read deadline -----------------------------------------------------------------------
    def handle_one_request(self):
        # From the first byte awaited to the last byte of the body: past it the socket is shut
        # down, the pending read returns short and the connection is dropped unanswered.
        self._expired = False
        self._deadline = threading.Timer(self.timeout, self._drop)
        self._deadline.daemon = True
        self._deadline.start()
        try:
            super().handle_one_request()
        finally:
            self._deadline.cancel()

    def _drop(self):
        self._expired = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --- answers ---------------------------------------------------------------------------------
    def _answer(self, status, obj, headers=(), close=False):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        if close or self._body_unread:  # nothing after an unread body can be framed
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, status, message, headers=(), close=False):
        # vLLM's failures are FastAPI's {"detail": ...}; ours {"success": false, "message"}.
        body = {"detail": message} if self.table.vllm else {"success": False, "message": message}
        self._answer(status, body, headers, close)

    # --- dispatch --------------------------------------------------------------------------------
    def _route(self, handlers, path):
        """The handler of `path` for this method, or None once a refusal is answered: 404, 405,
        then the token (401/403), all before the body is read."""
        fn = handlers.get(path)
        if fn is None:
            known = path in self.table.posts or path in self.table.gets
            self._fail(
                405 if known else 404,
                f"{'method not allowed on' if known else 'no route'} {self.path}",
                close=True,
            )
            return None
        if path not in guard.PUBLIC_PATHS:
            status = guard.check_bearer(self.headers.get("Authorization"), self.token)
            if status != 200:
                headers = [("WWW-Authenticate", "Bearer")] if status == 401 else []
                self._fail(status, guard.auth_failure(status, path), headers, close=True)
                return None
        return fn

    def _run(self, fn, path, arg):
        try:
            out = fn(arg)
            self._answer(200, out if self.table.is_plain(path) else {"success": True, "message": "", **out})
        except WorkerError as e:
            self._fail(e.status, str(e))
        except (KeyError, ValueError, TypeError) as e:
            self._fail(400, f"bad request: {e!r}")

    def _head_arrived(self):
        """False when the deadline cut the head short (the headers read may be partial)."""
        if self._expired:
            self.close_connection = True
        return not self._expired

    def do_GET(self):
        if not self._head_arrived():
            return
        self._deadline.cancel()  # the request has arrived
        # A GET's body is never read: a connection that sent one is closed after the answer.
        declared = self.headers.get("Content-Length", "0").strip() not in ("", "0")
        self._body_unread = declared or bool(self.headers.get("Transfer-Encoding"))
        url = urlparse(self.path)
        fn = self._route(self.table.gets, url.path)
        if fn is not None:
            self._run(fn, url.path, parse_qs(url.query))

    def do_POST(self):
        if not self._head_arrived():
            return
        url = urlparse(self.path)
        fn = self._route(self.table.posts, url.path)
        if fn is None:
            return
        status, length = guard.content_length(self.headers, self.max_body_bytes)
        if status != 200:
            return self._fail(status, _REFUSALS[status], close=True)
        raw = self.rfile.read(length) if length else b""
        if len(raw) != length or self._expired:  # the deadline passed, or the client left mid-body
            self.close_connection = True
            return
        self._deadline.cancel()
        self.engine.touch()
        try:
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as e:
            return self._fail(400, f"body: {e}")
        for key, values in parse_qs(url.query).items():
            body.setdefault(key, values[0])  # vLLM's query parameters (/pause?mode=...)
        self._run(fn, url.path, body)


def make_handler(engine, table, token="", max_body_bytes=64 << 20, read_timeout=30.0):
    attrs = {"engine": engine, "table": table, "token": token or "", "max_body_bytes": max_body_bytes}
    attrs["timeout"] = read_timeout
    return type("EngineHandler", (Handler,), attrs)


class _Server(ThreadingHTTPServer):
    # A trainer sends one bucket request per shard class at once, each on a connection of its
    # own; socketserver's listen backlog of 5 drops the connections beyond it, and their SYNs are
    # sent again only after a second: a deep backlog instead.
    request_queue_size = 1024
    daemon_threads = True


def make_server(engine, table, host, port, **guards):
    """A server bound to host:port (0: ephemeral) with the guards of make_handler()."""
    return _Server((host, port), make_handler(engine, table, **guards))
