"""The front's update session: who owns it, and the watchdog that ends an idle one.

This is the reference engine's only copy of the session rules (the workers' Receivers hold their
own sessions, which this front opens, feeds and closes). Sessions are owned as in
weightcast-engine: a begin that names a holder gets a session_id every later call must carry; an
id-less call is served only while no holder owns the open session.

Threading: `mu` guards `current`, `busy` and the watchdog's decision; the callers that open,
check and close a session take it around their check and their change, so the watchdog never
cuts a bucket mid-way nor aborts a session opened meanwhile.
"""

import secrets
import threading
import time

from .workers import WorkerError


class Sessions:
    def __init__(self, timeout):
        self.timeout = timeout  # a session (or a pause) idle this many seconds is ended
        self.mu = threading.Lock()
        self.current = None  # {"selector", "token", "holder"}
        self.last_activity = time.monotonic()
        self.busy = 0  # bucket requests in flight (bounded by the workers' comm timeout)

    def touch(self):
        self.last_activity = time.monotonic()

    def is_open(self):
        return self.current is not None

    def selector(self):
        return self.current["selector"] if self.current else None

    def check_closed(self):
        """Before a begin (under mu): a second session is refused."""
        if self.current is not None:
            raise WorkerError({"status": 409, "message": "begin_weight_update: a session is already open"})

    def open(self, selector, holder):
        """Records the session a begin opened (under mu); its session_id."""
        token = secrets.token_hex(16)
        self.current = {"selector": selector, "token": token, "holder": holder}
        return token

    def check_owner(self, token):
        s = self.current
        if s is None:
            raise WorkerError({"status": 409, "message": "no update session is open"})
        if token is not None and token != s["token"]:
            raise WorkerError({"status": 409, "message": "session_id does not name the open session"})
        if token is None and s["holder"] is not None:
            message = f"the session belongs to {s['holder']}; send its session_id"
            raise WorkerError({"status": 409, "message": message})

    def close_owned(self, token):
        """Closes the session `token` names (under mu); its selector."""
        self.check_owner(token)
        selector = self.current["selector"]
        self.current = None
        return selector

    def close(self):
        with self.mu:
            self.current = None

    def bucket_started(self, token, check):
        """A bucket request enters (the watchdog waits for it); `check`: its session is checked."""
        with self.mu:
            if check:
                self.check_owner(token)
            self.busy += 1

    def bucket_done(self):
        with self.mu:
            self.busy -= 1
        self.touch()

    def start_watchdog(self, abort_workers, paused):
        threading.Thread(target=self._watchdog, args=(abort_workers, paused), daemon=True).start()

    def _watchdog(self, abort_workers, paused):
        """As weightcast-engine: a session that sees no request for the timeout is aborted
        (abort_workers(reason)), and a pause left with no session and no request for as long is
        lifted (its trainer is gone; the engine must keep generating)."""
        limit = self.timeout
        while True:
            time.sleep(min(0.2, limit / 4))
            # Decided and done under mu, as update() counts its buckets and begin() opens a session:
            # no bucket is cut mid-way, and no session opened meanwhile is aborted.
            with self.mu:
                idle = time.monotonic() - self.last_activity
                if self.busy or idle < limit:
                    continue
                if self.current is not None:
                    self.current = None
                    try:
                        abort_workers(f"session timed out: no request for {limit} s")
                    except WorkerError:
                        pass
                    self.touch()
                elif paused.is_set():
                    paused.clear()
