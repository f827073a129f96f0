"""The torch reference engine's deployment guards, checked on real processes as
tests/security/auth_test.cc checks weightcast-engine's.

The route walk builds the engine's own route table (weightcast.reference.routes.route_table) for
each API (weightcast, sglang, vllm, with the test hooks), so a route added later is covered
without editing this file: every route, with GET and POST, without a token (401), with another
scheme (401) and with wrong tokens (403); refused calls carry bodies that would change the
engine's state and must change nothing. Only /health may be public. With the right token every
route of the table is served by the real process (so its table is the one walked).
The guards case sends bodies over --max-body-bytes (413, before the body is read), a chunked body
(411), and requests that stop half-way or trickle in: each is dropped unanswered and changes
nothing, while the engine keeps answering. The bind case checks that the engine refuses to
listen beyond loopback without a token.
Run one case: test_reference_security.py ReferenceSecurity.test_routes_vllm
"""

import http.client
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import torch_engines  # noqa: E402

torch_engines.require_torch()

from weightcast.reference import guard  # noqa: E402
from weightcast.reference.engine import Engine  # noqa: E402
from weightcast.reference.routes import route_table  # noqa: E402

TOKEN = "s3cret-t0ken"
MISSING = [None, "Basic dXNlcjpwYXNz", "Token " + TOKEN, "Bearer"]
WRONG = ["Bearer wrong", "Bearer " + TOKEN + "x", "Bearer " + TOKEN[:-1], "Bearer " + "A" * 4096]
RIGHT = "bEaReR  " + TOKEN + " "
SEED = 7
# Generous bounds: the engine's read deadline in these tests is 2 s.
READ_TIMEOUT_MS = 2000
DROP_BOUND_S = 90


def offline_table(api):
    """The route table the engine serves under --api `api` --debug-routes, built without workers."""
    engine = object.__new__(Engine)
    engine.cfg = {"api": api, "debug_routes": True}
    engine.workers = type("NoWorkers", (), {"call_all": None})()
    return route_table(engine)


def call(port, method, path, body=None, auth=None, timeout=120):
    """(status, headers, answer) of one request on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if auth is not None:
            headers["Authorization"] = auth
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(raw) if raw else None
    finally:
        conn.close()


class Listener:
    """A port nobody should dial: a refused init must not reach its master."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def dialled(self):
        return bool(select.select([self.sock], [], [], 0.2)[0])

    def close(self):
        self.sock.close()


def mutating_body(path, master_port, save_dir):
    """A body that would change the engine's state if the route ran it."""
    group = {
        "master_address": "127.0.0.1",
        "master_port": master_port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g",
        "backend": "gloo",
    }
    bodies = {
        "/init_weights_update_group": group,
        "/init_weight_transfer_engine": {"init_info": group},
        "/destroy_weights_update_group": {"group_name": "g"},
        "/pause_generation": {"mode": "in_place"},
        "/pause": {"mode": "abort"},
        "/begin_weight_update": {"selector": "all"},
        "/start_weight_update": {"selector": "target"},
        "/update_weight_version": {"new_version": "evil"},
        "/finish_weight_update": {"weight_version": "evil"},
        "/generate": {"input_ids": [1, 2, 3]},
        "/debug/save_params": {"path": save_dir},
        "/debug/fail_load": {"tensor": "model.norm.weight"},
        "/debug/fail_bucket": {"sequence": 0},
    }
    return bodies.get(path, {})


def state(port):
    """What a refused call could have changed, read with the token."""
    status, _, info = call(port, "GET", "/debug/info", auth="Bearer " + TOKEN)
    assert status == 200, info
    keys = (
        "weight_version",
        "in_session",
        "bytes_received",
        "delta_base_bytes",
        "draft_processed",
        "fail_on",
    )
    workers = [{k: w[k] for k in keys} for w in info["workers"]]
    return {k: info[k] for k in ("paused", "session_open", "weight_version", "fail_bucket")} | {
        "workers": workers
    }


def port_of(engine):
    return int(engine.url.rsplit(":", 1)[1])


class ReferenceSecurity(unittest.TestCase):
    def walk(self, api):
        table = offline_table(api)
        self.assertTrue(table.paths())
        extra = ["--no-draft", "--api", api, "--token", TOKEN, "--comm-timeout", "5"]
        store, save_dir = Listener(), tempfile.mkdtemp(prefix="wc-reference-security-")
        try:
            with torch_engines.running([1], SEED, extra) as (engine,):
                port = port_of(engine)
                before = state(port)
                checked = self.refuse_all(table, port, store.port, save_dir)
                self.assertEqual(state(port), before, "a refused call changed the engine")
                self.assertFalse(store.dialled(), "a refused init dialled its master")
                self.assertEqual(os.listdir(save_dir), [], "a refused save wrote its files")
                self.serve_all(table, port)
                # The probe sees changes: the pause it refused is served with the token.
                pause = "/pause" if api == "vllm" else "/pause_generation"
                status, _, answer = call(port, "POST", pause, mutating_body(pause, 0, ""), RIGHT)
                self.assertEqual(status, 200, answer)
                self.assertTrue(state(port)["paused"])
                print(
                    f"[figure] reference engine auth ({api}): {len(table.paths())} routes, "
                    f"{checked} refused calls checked"
                )
        finally:
            store.close()
            for name in os.listdir(save_dir):
                os.unlink(os.path.join(save_dir, name))
            os.rmdir(save_dir)

    def refuse_all(self, table, port, master_port, save_dir):
        public, checked = set(), 0
        for path in table.paths():
            methods = {m for m, routes in (("GET", table.gets), ("POST", table.posts)) if path in routes}
            if path in guard.PUBLIC_PATHS:
                public.add(path)
                self.assertNotIn("POST", methods, f"{path} takes POST but needs no token")
            url = path + "?runner=target" if path == "/weights_checksum" else path
            for method in ("GET", "POST"):
                body = mutating_body(path, master_port, save_dir) if method == "POST" else None
                allowed = method in methods
                for auth in MISSING + WRONG:
                    with self.subTest(method=method, path=path, auth=(auth or "")[:40]):
                        status, headers, answer = call(port, method, url, body, auth)
                        checked += 1
                        if not allowed:
                            self.assertEqual(status, 405, answer)
                        elif path in guard.PUBLIC_PATHS:
                            self.assertEqual(status, 200, answer)
                        elif auth in MISSING:
                            self.assertEqual(status, 401, answer)
                            self.assertEqual(headers.get("www-authenticate"), "Bearer")
                        else:
                            self.assertEqual(status, 403, answer)
                        if status in (401, 403):
                            self.assertIn("Authorization", json.dumps(answer))
        self.assertEqual(public, {"/health"})
        return checked

    def serve_all(self, table, port):
        """With the right token every route of the table is the real process's, and none refuses
        it."""
        for path in table.paths():
            url = path + "?runner=target" if path == "/weights_checksum" else path
            for method, routes in (("GET", table.gets), ("POST", table.posts)):
                if path in routes:
                    status, _, answer = call(port, method, url, {} if method == "POST" else None, RIGHT)
                    self.assertNotIn(status, (401, 403, 404, 405), f"{method} {path}: {answer}")

    def test_routes_weightcast(self):
        self.walk("weightcast")

    def test_routes_sglang(self):
        self.walk("sglang")

    def test_routes_vllm(self):
        self.walk("vllm")

    def test_guards(self):
        """The body-size limit and the read deadline on a real engine."""
        extra = [
            "--no-draft",
            "--token",
            TOKEN,
            "--max-body-bytes",
            "1K",
            "--http-timeout-ms",
            str(READ_TIMEOUT_MS),
        ]
        with torch_engines.running([1], SEED, extra) as (engine,):
            port = port_of(engine)
            before = state(port)
            self.check_body_limits(port)
            self.check_read_deadline(port)
            self.assertEqual(state(port), before, "a refused or dropped request changed the engine")
            # The probe sees changes: a whole request with the token is served.
            self.assertEqual(
                call(port, "POST", "/pause_generation", {"mode": "in_place"}, "Bearer " + TOKEN)[0], 200
            )
            self.assertTrue(state(port)["paused"])

    def check_body_limits(self, port):
        auth = f"Authorization: Bearer {TOKEN}\r\n"
        head = "POST /pause_generation HTTP/1.1\r\nHost: x\r\n"
        # Over the limit: 413 at once, the body never sent; the connection is closed after it.
        status, closed = raw_exchange(port, head + auth + "Content-Length: 5000\r\n\r\n")
        self.assertEqual((status, closed), (413, True))
        # The token is decided first, as weightcast-engine's.
        self.assertEqual(raw_exchange(port, head + "Content-Length: 5000\r\n\r\n")[0], 401)
        # Chunked (no length to check): 411; a malformed length: 400.
        chunked = head + auth + "Transfer-Encoding: chunked\r\n\r\n"  # refused before its chunks
        self.assertEqual(raw_exchange(port, chunked), (411, True))
        self.assertEqual(raw_exchange(port, head + auth + "Content-Length: abc\r\n\r\n")[0], 400)
        # A GET's body is never read: answered, then the connection is closed.
        self.assertEqual(
            raw_exchange(port, "GET /health HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"), (200, True)
        )
        # At the limit: served (on a route that changes nothing).
        body = json.dumps({"pad": "x" * (1024 - 11)})
        self.assertEqual(len(body), 1024)
        status, _, answer = call(port, "POST", "/flush_cache", json.loads(body), "Bearer " + TOKEN)
        self.assertEqual(status, 200, answer)

    def check_read_deadline(self, port):
        auth = f"Authorization: Bearer {TOKEN}\r\n"
        pause = "POST /pause_generation HTTP/1.1\r\nHost: x\r\n" + auth
        body = '{"mode": "in_place"}'
        silent = [
            "",  # connected, nothing sent
            pause,  # half a head: its headers must not be served as a whole request
            pause + f"Content-Length: {len(body)}\r\n\r\n" + body[:8],  # half a body
        ]
        held = [open_and_send(port, text) for text in silent]
        trickle = open_and_send(port, pause + "Content-Length: 200\r\n\r\n")
        # While they are held, the engine answers others.
        self.assertEqual(call(port, "GET", "/health")[0], 200)
        start = time.monotonic()
        try:
            for i, sock in enumerate(held):
                with self.subTest(silent=i):
                    answer = read_until_closed(sock, start + DROP_BOUND_S)
                    self.assertEqual(answer, b"", "a partial request was answered")
        finally:
            for sock in held:
                sock.close()
        # A byte at a time, each well within the socket timeout: the whole-request deadline drops it.
        dropped = False
        while time.monotonic() < start + DROP_BOUND_S and not dropped:
            try:
                trickle.sendall(b" ")
            except OSError:  # reset: the server closed it
                dropped = True
                break
            if select.select([trickle], [], [], READ_TIMEOUT_MS / 4000)[0]:
                self.assertEqual(
                    read_until_closed(trickle, time.monotonic() + 30), b"", "a trickle was answered"
                )
                dropped = True
        trickle.close()
        self.assertTrue(dropped, "a trickling client was never dropped")

    def test_bind_refusal(self):
        """No token beyond loopback: refused before anything starts, under both module names."""
        for module in ("weightcast.reference", "weightcast.torch_engine"):
            for host in ("0.0.0.0", "::", "10.1.2.3"):
                with self.subTest(module=module, host=host):
                    r = subprocess.run(
                        [sys.executable, "-m", module, "--host", host, "--port", "0"],
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                    self.assertIn(f"refusing to listen on {host} without --token", r.stderr)
        # The TP group's store binds --tp-host: an address not of this host is a one-line error
        # before any worker starts (no traceback, nothing left running).
        r = subprocess.run(
            [sys.executable, "-m", "weightcast.reference", "--port", "0", "--tp-host", "10.1.2.3"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("weightcast.reference: c10d store server cannot listen on 10.1.2.3", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
            self.assertIsNone(guard.bind_refusal(host, ""), host)
        for host in ("0.0.0.0", "10.1.2.3", "::", "127"):
            self.assertIsNone(guard.bind_refusal(host, TOKEN), host)
            self.assertIsNotNone(guard.bind_refusal(host, ""), host)

    def test_bearer_rules(self):
        """The header rules, as sync/engine/http/auth.cc's check_bearer."""
        cases = [
            (None, 401),
            ("", 401),
            ("Bearer", 401),
            ("Basic " + TOKEN, 401),
            ("Bearer " + TOKEN, 200),
            ("bearer " + TOKEN, 200),
            ("BEARER   " + TOKEN + " \t", 200),
            ("Bearer " + TOKEN.upper(), 403),
            ("Bearer  ", 403),
            ("Bearer " + TOKEN + "\x00", 403),
        ]
        for header, want in cases:
            self.assertEqual(guard.check_bearer(header, TOKEN), want, repr(header))
            self.assertEqual(guard.check_bearer(header, ""), 200, repr(header))
        self.assertEqual(guard.parse_bytes("64M"), 64 << 20)
        self.assertEqual(guard.parse_bytes("1k"), 1024)
        for text in ("", "M", "1T", "-1", "1.5M"):
            with self.assertRaises(ValueError, msg=text):
                guard.parse_bytes(text)


def open_and_send(port, text):
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    if text:
        sock.sendall(text.encode())
    return sock


def read_until_closed(sock, deadline):
    """Everything the server sends until it closes the connection (b"" if it answers nothing)."""
    out = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"the connection was not closed in time (got {out[:200]!r})")
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def raw_exchange(port, text):
    """(status, closed): the first answer's status, and whether the server closed after it."""
    sock = open_and_send(port, text)
    try:
        data = read_until_closed(sock, time.monotonic() + DROP_BOUND_S)
    finally:
        sock.close()
    status_line = data.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 else 0
    return status, data.count(b"HTTP/1.1 ") == 1


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:], verbosity=2)
