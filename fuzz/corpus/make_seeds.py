#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (fuzz/corpus/protocol,
fuzz/corpus/store_protocol). Rerun after changing a schema; the files are small and reviewed.

Each seed starts with the target's selector byte (see the comment at the top of
fuzz/protocol_fuzz.cc and fuzz/store_protocol_fuzz.cc), then the body.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

TIGHT = 0x10  # protocol target: tight limits


def write(folder, name, data):
    os.makedirs(os.path.join(HERE, folder), exist_ok=True)
    with open(os.path.join(HERE, folder, name), "wb") as f:
        f.write(data)


def j(value):
    return json.dumps(value, separators=(",", ":")).encode()


BUCKET = {
    "names": ["model.a", "model.b", "model.norm"],
    "dtypes": ["bfloat16", "torch.float32", "half"],
    "shapes": [[32, 64], [16, 96], [64]],
    "group_name": "weightcast-pp_0",
    "selector": "target",
    "sequence": 0,
    "load_format": "flattened_bucket",
    "flush_cache": True,
    "weight_version": "3",
}

PROTOCOL = {
    0: [{"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
         "world_size": 2, "group_name": "weightcast-pp_0", "backend": "gloo"}],
    1: [{"group_name": "weightcast-pp_0"}, b""],
    2: [{"mode": "in_place"}, {"mode": "retract"}],
    3: [{"torch_empty_cache": False}, b""],
    4: [b"", {}],
    5: [{"selector": "target"}, {"selector": "all", "rid": "x"}],
    6: [BUCKET, dict(BUCKET, shapes=[[1 << 40, 1 << 30], [16, 96], [64]])],
    7: [{"new_version": "12", "abort_all_requests": False}],
    8: [b"", {}],
    9: [{"success": False, "message": "shapes[0][1]: must be >= 0 (got -2)"}],
    10: [{"success": True, "message": "", "accept_length": 2.7, "draft_tokens": 3,
          "weight_version": "1"}],
    11: [{"success": True, "message": "session opened", "selector": "target"}],
    12: [{"success": True, "message": "committed", "weight_version": "12",
          "runners": [{"runner": "target", "tensors_loaded": 21, "tensors_transformed": 21},
                      {"runner": "draft", "tensors_loaded": 0, "tensors_transformed": 0}]}],
    13: [{"success": True, "message": "", "version": "0.1.0",
          "runners": [{"name": "target", "filters": ["model.*", "lm_head.*"],
                       "layout": "shuffle", "tensor_count": 21},
                      {"name": "draft", "filters": ["mtp.*"], "layout": "none",
                       "tensor_count": 4}],
          "selectors": ["all", "target", "draft"], "backends": ["gloo"], "rank_count": 1,
          "tp_size": 1, "weight_version": "default", "speculative_algorithm": "EAGLE",
          "session_selector": None}],
    14: [{"success": True, "message": "", "runner": "draft", "weight_version": "default",
          "digest": "0123456789abcdef0123456789abcdef",
          "tensors": [{"name": "mtp.fc.weight", "digest": "00ff00ff00ff00ff00ff00ff00ff00ff",
                       "dtype": "bfloat16", "shape": [64, 128]}]}],
}


def protocol_seeds():
    for which, bodies in PROTOCOL.items():
        for k, body in enumerate(bodies):
            data = body if isinstance(body, bytes) else j(body)
            write("protocol", "%02d-%d" % (which, k), bytes([which]) + data)
            write("protocol", "%02d-%d-tight" % (which, k), bytes([which | TIGHT]) + data)
    # Hostile shapes the unit tests also use: deep nesting, bad UTF-8, duplicate keys.
    write("protocol", "05-deep", bytes([5]) + b'{"selector":' + b"[" * 40 + b"]" * 40 + b"}")
    write("protocol", "05-utf8", bytes([5]) + b'{"selector":"t\xc3\x28rget"}')
    write("protocol", "05-dupkey", bytes([5]) + b'{"selector":"target","selector":"all"}')


# Store protocol (comm/store/store_protocol.h).
HELLO, SET, GET, WAIT, ADD, CHECK = 1, 2, 3, 4, 5, 6


def s(b):
    return struct.pack("<I", len(b)) + b


def request(op, keys, value=b"", timeout_ms=1000):
    return (struct.pack("<BII", op, timeout_ms, len(keys)) + b"".join(s(k) for k in keys)
            + s(value))


def response(status, message=b"", value=b""):
    return struct.pack("<B", status) + s(message) + s(value)


def frame(body):
    return struct.pack("<I", len(body)) + body


def store_seeds():
    requests = {
        "hello": request(HELLO, [b"weightcast-store/1"], b"s3cret"),
        "set": request(SET, [b"weightcast-pp_0/nccl_id"], b"\x00\x01\x02" * 8),
        "get": request(GET, [b"weightcast-pp_0/rank/1"]),
        "wait": request(WAIT, [b"a", b"b", b"c"], timeout_ms=30000),
        "add": request(ADD, [b"arrived"], struct.pack("<q", -1)),
        "check": request(CHECK, [b"weightcast-pp_0/rank/0"]),
    }
    responses = {
        "ok": response(0, b"", b"value bytes"),
        "timeout": response(1, b"GET: keys did not appear: rank/1"),
        "add": response(0, b"", struct.pack("<q", 7)),
        "forbidden": response(5, b"forbidden (wrong token)"),
    }
    for name, body in requests.items():
        write("store_protocol", "req-" + name, bytes([0]) + body)
        write("store_protocol", "req-" + name + "-small", bytes([4]) + body)
    for name, body in responses.items():
        write("store_protocol", "resp-" + name, bytes([1]) + body)
    write("store_protocol", "stream-session",
          bytes([2]) + b"".join(frame(requests[k]) for k in ("hello", "set", "get", "add")))
    write("store_protocol", "stream-half-frame",
          bytes([2]) + frame(requests["hello"]) + frame(requests["set"])[:9])
    write("store_protocol", "stream-huge-claim", bytes([2]) + struct.pack("<I", 0xFFFFFFF0))
    write("store_protocol", "stream-responses",
          bytes([3]) + b"".join(frame(responses[k]) for k in ("ok", "add", "timeout")))


if __name__ == "__main__":
    protocol_seeds()
    store_seeds()
