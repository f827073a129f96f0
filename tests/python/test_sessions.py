"""The one session state machine from Python: weightcast.SessionMachine (the front of the torch
reference engine) and a Receiver's own session answer with weightcast-engine's rules and words,
and a bucket request with no session open is its own sessionless update that other callers cannot
act on. No engine process, no torch: the extension module alone."""

import unittest

import weightcast
from weightcast.receiver import ReceiverError, SessionMachine


class Sessions(unittest.TestCase):
    def refused(self, call, status, words):
        with self.assertRaises(ReceiverError) as caught:
            call()
        self.assertEqual(caught.exception.status, status)
        self.assertIn(words, str(caught.exception))

    def test_owner_rules_are_the_engines(self):
        m = SessionMachine()
        self.assertFalse(m.in_session)
        token = m.begin("target", "trainer-0")
        self.assertEqual((m.selector, m.owned, m.token), ("target", True, token))
        self.refused(lambda: m.begin("all"), 409, "engine busy")
        self.refused(lambda: m.check_owner(None, "end_weight_update"), 409, "'trainer-0'")
        self.refused(lambda: m.check_owner("f" * 32, "end_weight_update"), 409, "is not the open session")
        self.refused(lambda: m.check_payload("draft"), 409, "differs from the session's 'target'")
        m.check_owner(token, "end_weight_update")
        self.assertFalse(m.set_version("v1"))  # staged in a session
        self.assertEqual(m.pending_version, "v1")
        self.assertTrue(m.close())
        self.refused(lambda: m.check_open(token, "update_weight_version"), 409, "is not open")
        self.refused(m.check_end, 409, "end without begin")
        self.assertTrue(m.set_version("v2"))  # applied at once outside one
        self.refused(lambda: m.begin("everything"), 400, "selector")

    def test_a_sessionless_session_is_held_by_its_token(self):
        m = SessionMachine()
        token = m.begin("all", None, True)
        self.assertTrue(m.sessionless)
        self.refused(lambda: m.check_owner(None, "update_weights_from_distributed"), 409, "sessionless")
        m.check_owner(token, "update_weights_from_distributed")

    def test_a_receivers_session_is_the_same_machine(self):
        rx = weightcast.Receiver([weightcast.Runner("target", lambda items: None)])
        begun = rx.begin("target", sessionless=True)
        self.assertTrue(rx.in_session and rx.sessionless)
        self.refused(lambda: rx.commit(), 409, "sessionless update in progress")
        rx.commit(session_id=begun["session_id"])  # nothing staged: commits nothing
        self.assertFalse(rx.in_session)
        rx.begin("target", holder="trainer-0")
        self.assertFalse(rx.sessionless)
        self.refused(lambda: rx.begin("all"), 409, "engine busy")
        rx.abort("done")


if __name__ == "__main__":
    unittest.main(verbosity=2)
