#!/usr/bin/env python3
"""Round-trip time of an engine's control routes, a new connection per request against one
kept-alive connection (docs/performance.md, "Control plane").

    scripts/bench-http-latency.py http://127.0.0.1:30000 [--requests 300] [--routes /health,...]

Prints one row per route: milliseconds per request on new connections, on one keep-alive
connection, and their ratio. Standard library only (http.client, as a Python trainer's client).
"""
import argparse
import http.client
import sys
import time
import urllib.parse


def per_request(host, port, route, n, keep_alive, timeout):
    conn = None
    start = time.perf_counter()
    for _ in range(n):
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", route)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            sys.exit(f"{route}: HTTP {answer.status}")
        if not keep_alive:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return (time.perf_counter() - start) / n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="the engine, http://host:port")
    p.add_argument("--requests", type=int, default=300, help="requests per route and mode")
    p.add_argument("--routes", default="/health,/server_info,/get_weight_version")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds, each socket operation")
    a = p.parse_args()
    if a.requests < 1:
        p.error("--requests must be >= 1")
    u = urllib.parse.urlsplit(a.url)
    if u.scheme != "http" or not u.hostname or not u.port:
        p.error(f"url {a.url!r}: expected http://host:port")
    print(f"{'route':<22} {'new conn (ms)':>14} {'keep-alive (ms)':>16} {'new / kept':>11}")
    for route in a.routes.split(","):
        fresh = per_request(u.hostname, u.port, route, a.requests, False, a.timeout)
        kept = per_request(u.hostname, u.port, route, a.requests, True, a.timeout)
        print(f"{route:<22} {fresh * 1e3:>14.3f} {kept * 1e3:>16.3f} {fresh / kept:>10.2f}x")


if __name__ == "__main__":
    main()
