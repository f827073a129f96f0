"""A torch worker for tests/interop/c10d_store_abuse_test.cc: a real torch.distributed TCPStore
client (is_master=False) on weightcast's C10dStoreServer that keeps doing what a rendezvous does
while other connections abuse the server. Stdlib + torch only.

usage: c10d_store_worker.py PORT ROUNDS

Prints "JOINED", then for each round i it waits for the test's key "go/<i>", sets "torch/<i>",
adds to "ctr", reads "go/<i>" and its own key back, and prints "ROUND <i> <ctr> <go> <ok>".
Exit code 0 only when every round ran.
"""
import datetime
import sys

import torch.distributed as dist


def main():
    port, rounds = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=60))
    print("JOINED", flush=True)
    for i in range(rounds):
        store.wait(["go/%d" % i])
        store.set("torch/%d" % i, b"t" * 1000)
        ctr = store.add("ctr", 1)
        back = store.get("go/%d" % i).decode()
        ok = store.get("torch/%d" % i) == b"t" * 1000
        print("ROUND", i, ctr, back, ok, flush=True)


if __name__ == "__main__":
    main()
