"""The torch side of tests/interop/c10d_store_interop_test.cc: a real torch.distributed store
talking to weightcast's C10dStore / C10dStoreServer. Stdlib + torch only.

usage: c10d_store_peer.py host PREFIX                 torch hosts the store (prints "PORT <n>")
       c10d_store_peer.py worker PREFIX PORT          TCPStore(is_master=False) joins ours
       c10d_store_peer.py rendezvous PREFIX PORT      torch.distributed.rendezvous("tcp://...")

Then both sides run the same dialogue (see dialogue()); every step the C++ test checks prints one
line. Exit code 0 only when the whole dialogue ran.
"""
import datetime
import sys
import time

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=30)
ADDS = 20


def say(*words):
    print(*words, flush=True)


def dialogue(store, p):
    store.set(p + "from_torch", b"torch-bytes\x00\xff")
    say("FROM_WC", store.get(p + "from_wc").hex())  # blocks until weightcast sets it
    for _ in range(ADDS):
        store.add(p + "ctr", 1)
    store.set(p + "torch_added", "1")
    store.wait([p + "wc_added"])
    say("CTR", store.get(p + "ctr").decode())
    say("WAITING")
    store.wait([p + "wc_late"])  # weightcast sets it only after reading WAITING
    say("WAITED")
    time.sleep(0.3)
    store.set(p + "torch_late", "late")
    say("CAS", store.compare_set(p + "cas", "", "first").decode())
    store.wait([p + "wc_finished"])
    say("DONE")


def main():
    mode, prefix = sys.argv[1], sys.argv[2]
    if mode == "host":
        # torch 1.13: TCPStore(host_name, port, world_size=None, is_master=False,
        #                      timeout=300s, wait_for_workers=True, multi_tenant=False)
        store = dist.TCPStore("127.0.0.1", 0, 2, True, TIMEOUT, wait_for_workers=False)
        say("PORT", store.port)
    elif mode == "worker":
        store = dist.TCPStore("127.0.0.1", int(sys.argv[3]), 2, False, TIMEOUT)
        say("JOINED")
    elif mode == "rendezvous":
        url = "tcp://127.0.0.1:%s?rank=1&world_size=2" % sys.argv[3]
        store, rank, world_size = next(dist.rendezvous(url, timeout=TIMEOUT))
        say("JOINED", rank, world_size)
    else:
        raise SystemExit("unknown mode " + mode)
    dialogue(store, prefix)


if __name__ == "__main__":
    main()
