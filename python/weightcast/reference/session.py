"""The front's update session: who owns it, and the watchdog that ends an idle one.

The session's rules are not kept here: the front holds one `SessionMachine`, the C++ state machine
weightcast-engine and every Receiver keep (sync/engine/control/session.h, bound by the extension),
and answers with its refusals and its words. This class adds only what the front needs around it:
its lock, the count of bucket requests in flight, and the idle watchdog. (The workers' Receivers
hold their own sessions, which this front opens, feeds and closes.) Sessions are owned as in
weightcast-engine: a begin that names a holder gets a session_id every later call must carry; an
id-less call is served only while no holder owns the open session.

Threading: `mu` guards the machine, `busy` and the watchdog's decision; the callers that open,
check and close a session take it around their check and their change, so the watchdog never
cuts a bucket mid-way nor aborts a session opened meanwhile.
"""

import threading
import time

from ..receiver import ReceiverError, SessionMachine
from .workers import WorkerError


def _refused(e):
    return WorkerError({"status": getattr(e, "status", 409), "message": str(e)})


class Sessions:
    def __init__(self, timeout):
        self.timeout = timeout  # a session (or a pause) idle this many seconds is ended
        self.mu = threading.Lock()
        self.machine = SessionMachine()
        self.last_activity = time.monotonic()
        self.busy = 0  # bucket requests in flight (bounded by the workers' comm timeout)

    def touch(self):
        self.last_activity = time.monotonic()

    def is_open(self):
        return self.machine.in_session

    def selector(self):
        return self.machine.selector

    def open(self, selector, holder):
        """Opens the session a begin asks for (under mu); its session_id. A session already open
        is refused with the machine's answer."""
        try:
            return self.machine.begin(selector, holder)
        except ReceiverError as e:
            raise _refused(e) from None

    def check_owner(self, token, route="update_weight_version"):
        """Whether a call from `route` carrying `token` may act on the open session."""
        try:
            self.machine.check_open(token, route)
            self.machine.check_owner(token, route)
        except ReceiverError as e:
            raise _refused(e) from None

    def close_owned(self, token):
        """Closes the session `token` names (under mu); its selector."""
        try:
            self.machine.check_end()
            self.machine.check_owner(token, "end_weight_update")
        except ReceiverError as e:
            raise _refused(e) from None
        selector = self.machine.selector
        self.machine.close()
        return selector

    def discard(self):
        """Leaves the session (under mu), e.g. when the workers refused its begin."""
        self.machine.close()

    def close(self):
        with self.mu:
            self.machine.close()

    def bucket_started(self, token, check, route="update_weights_from_distributed"):
        """A bucket request enters (the watchdog waits for it); `check`: its session is checked."""
        with self.mu:
            if check:
                self.check_owner(token, route)
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
                if self.machine.in_session:
                    self.machine.close()
                    try:
                        abort_workers(f"session timed out: no request for {limit} s")
                    except WorkerError:
                        pass
                    self.touch()
                elif paused.is_set():
                    paused.clear()
