"""The reference engine's deployment guards, the same as weightcast-engine's (docs/security.md):

- with --token, every route but /health needs "Authorization: Bearer <token>" (scheme
  case-insensitive, token exact, compared in constant time); no header or another scheme is 401
  with WWW-Authenticate: Bearer, a wrong token 403, both decided before the body is read;
- a body is read only when its Content-Length is at most --max-body-bytes (413 otherwise, and the
  connection is closed); a body without a Content-Length (chunked) is refused with 411;
- the whole request, head and body, must arrive within --http-timeout-ms, or the connection is
  dropped unanswered (a slow or silent client cannot hold a handler thread);
- without a token the engine refuses to listen beyond loopback.

Pure functions and constants; safe from any thread.
"""

import hmac

PUBLIC_PATHS = frozenset({"/health"})  # answered without a token, as weightcast-engine's /health

_SCHEME = "bearer "
_UNITS = {
    "": 0,
    "B": 0,
    "K": 10,
    "KB": 10,
    "KIB": 10,
    "M": 20,
    "MB": 20,
    "MIB": 20,
    "G": 30,
    "GB": 30,
    "GIB": 30,
}


def check_bearer(header, token):
    """The HTTP status the Authorization header `header` (None when absent) earns: 200, 401
    (missing, or another scheme) or 403 (a wrong token). An empty `token`: everything is 200."""
    if not token:
        return 200
    if header is None or len(header) < len(_SCHEME) or header[: len(_SCHEME)].lower() != _SCHEME:
        return 401
    given = header[len(_SCHEME) :].lstrip(" ").rstrip(" \t")
    # compare_digest takes time that depends only on the lengths, never on where they differ.
    return 200 if hmac.compare_digest(given.encode(), token.encode()) else 403


def auth_failure(status, path):
    """The message of a 401 or 403, as weightcast-engine words it."""
    if status == 401:
        return f"Authorization: a bearer token is required on {path}"
    return "Authorization: the bearer token is wrong"


def loopback_host(host):
    """As weightcast-engine's: only these hosts may serve without a token."""
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def bind_refusal(host, token):
    """None when the engine may listen on `host`; else why not."""
    if token or loopback_host(host):
        return None
    return (
        f"refusing to listen on {host} without --token: anyone who can reach this address could "
        "update, abort or pause this engine (give --token, or listen on a loopback address)"
    )


def parse_bytes(text):
    """A byte count with an optional K/M/G suffix (binary), as weightcast-engine's flags take."""
    digits = len(text) - len(text.lstrip("0123456789"))
    unit = text[digits:].upper()
    if digits == 0 or unit not in _UNITS:
        raise ValueError(f"not a byte count: '{text}' (examples: 4096, 64K, 1M, 2G)")
    return int(text[:digits]) << _UNITS[unit]


def content_length(headers, max_body_bytes):
    """(status, length) for a POST's headers: (200, n) when the body may be read; 411 without a
    length to check (chunked), 400 for a malformed one, 413 past the limit."""
    if headers.get("Transfer-Encoding"):
        return 411, 0
    values = headers.get_all("Content-Length") or []
    if not values:
        return 200, 0
    if len(set(values)) != 1 or not (values[0].strip().isascii() and values[0].strip().isdigit()):
        return 400, 0
    length = int(values[0])
    if length > max_body_bytes:
        return 413, length
    return 200, length


def positive_int(text):
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1 (got {value})")
    return value
