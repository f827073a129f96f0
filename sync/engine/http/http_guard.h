// The engine's HTTP server with a guard on every connection, for what cpp-httplib 0.11 (the
// Debian version) leaves unbounded: it stores any number of header lines, buffers a header line
// that never ends, accepts a chunked (or unsized) body of any size despite its payload limit,
// discards an oversized Content-Length body byte by byte, and restarts its read timeout with
// every byte, so one client could exhaust the engine's memory or hold a handler thread forever.
//
// The guard reads each connection itself and hands httplib a stream that enforces, per request:
//   - the request line and headers together at most kMaxRequestHeadBytes;
//   - the body at most its Content-Length (none when that exceeds the payload limit, so the 413
//     goes out at once), or twice the payload limit plus framing when chunked or unsized;
//   - the whole request (head and body) read within the server's read timeout, the whole
//     response written within its write timeout.
// A request over a limit is dropped: the connection is closed (with a 413 where httplib already
// chose one). Limits and timeouts come from the httplib::Server settings (set_read_timeout,
// set_payload_max_length, set_keep_alive_*), so callers configure it as any httplib::Server.
// Lifetime: as httplib::Server. Threading: as httplib::Server; each connection is read by one
// worker thread.
#pragma once

#include <cstddef>
#include <memory>

namespace httplib {
class Server;
}

namespace weightcast::sync::engine {

inline constexpr std::size_t kMaxRequestHeadBytes = 64u << 10;

std::unique_ptr<httplib::Server> make_guarded_http_server();

}  // namespace weightcast::sync::engine
