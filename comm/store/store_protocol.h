// Wire protocol of the TCP store: pure encode/decode functions over byte buffers, shared by
// TcpStoreServer and TcpStore and drivable by a fuzzer (no sockets, no global state).
// Lifetime: stateless. Threading: every function is reentrant.
//
// Framing. Every message is a frame: a u32 body length, then the body. All integers are
// little-endian; strings are a u32 length followed by that many raw bytes (any byte, NUL too).
// The receiver checks the body length against check_*_frame_length() before reading the body,
// and the decoders check every inner length against its limit and against the bytes left before
// allocating anything, so a claimed length never turns into an allocation of that size.
//
// Request body:
//   u8   op            1 HELLO, 2 SET, 3 GET, 4 WAIT, 5 ADD, 6 CHECK
//   u32  timeout_ms    how long the server may block (GET, WAIT); informational for the others
//   u32  key_count     at most kMaxKeysPerRequest
//   key_count x str    each 1..Store::kMaxKeyBytes bytes
//   str  value         at most max_value_bytes
// Per op: HELLO has one key, kProtocolName, and the token as value (empty without a token);
// SET, GET, ADD, CHECK have exactly one key; WAIT has at least one; only SET, HELLO and ADD carry
// a value, and ADD's is the delta as 8 bytes (i64, two's complement).
//
// Response body:
//   u8   status        see Status
//   str  message       at most kMaxMessageBytes; why a request failed
//   str  value         GET: the value; ADD: the new counter (8 bytes, i64); CHECK: one byte 0/1
//
// Session. A client sends HELLO first; with a token configured the server refuses any other first
// frame ("unauthorized (missing token)") and a wrong token ("forbidden (wrong token)"), then
// closes; until then it refuses frames longer than kMaxHelloBodyBytes unread. Requests are answered
// in order, one at a time. After kOk, kTimeout and kRejected the connection stays open; after any
// other status the server closes it, because the byte stream can no longer be trusted to be in
// step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::comm::store_protocol {

inline constexpr std::string_view kProtocolName = "weightcast-store/1";
inline constexpr std::size_t kFrameHeaderBytes = 4;
inline constexpr std::size_t kMaxKeysPerRequest = 4096;
inline constexpr std::size_t kMaxMessageBytes = 4096;
inline constexpr std::size_t kMaxTokenBytes = 4096;
// Before a connection has authenticated, frames are held to what a HELLO needs, so an
// unauthenticated peer cannot make the server buffer a full-size value.
inline constexpr std::size_t kMaxHelloBodyBytes = 1 + 4 + 4 + 4 + 64 + 4 + kMaxTokenBytes;
// Frame lengths are u32; keeping values far below that leaves room for the other fields.
inline constexpr std::size_t kMaxValueBytesLimit = std::size_t{1} << 30;

enum class Op : std::uint8_t { kHello = 1, kSet = 2, kGet = 3, kWait = 4, kAdd = 5, kCheck = 6 };

enum class Status : std::uint8_t {
  kOk = 0,
  kTimeout = 1,       // GET/WAIT: the keys did not appear in time; message names them
  kBadRequest = 2,    // malformed frame; connection closed
  kUnauthorized = 3,  // no token presented; connection closed
  kTooLarge = 4,      // a length over its limit; connection closed
  kForbidden = 5,     // wrong token; connection closed
  kRejected = 6,      // well-formed but refused (ADD on a non-counter, overflow); stays open
  kUnavailable = 7,   // server at its connection limit or stopping; connection closed
};

std::string_view op_name(Op op);
std::string_view status_name(Status status);
// Whether the server keeps the connection open after answering with `status`.
bool keeps_connection(Status status);

struct Request {
  Op op = Op::kHello;
  std::uint32_t timeout_ms = 0;
  std::vector<std::string> keys;
  std::string value;
};

struct Response {
  Status status = Status::kOk;
  std::string message;
  std::string value;
};

struct Limits {
  std::size_t max_value_bytes = 0;
  std::size_t max_keys = kMaxKeysPerRequest;
};

// Outcome of a decode: on failure `status` says how to answer (kBadRequest or kTooLarge) and
// `error` says why, naming the field.
template <typename T>
struct Decoded {
  Status status = Status::kOk;
  std::string error;
  T value{};
  bool ok() const { return status == Status::kOk; }
};

// Whole frames, header included, ready to send. Messages longer than kMaxMessageBytes are cut.
std::string encode_request(const Request& request);
std::string encode_response(const Response& response);

// Reads the u32 body length from the first kFrameHeaderBytes of `header`.
std::uint32_t decode_frame_length(std::string_view header);

// The largest body a well-formed frame can have under `limits`; anything longer is kTooLarge.
std::size_t max_request_body_bytes(const Limits& limits);
std::size_t max_response_body_bytes(std::size_t max_value_bytes);

// kOk when a body of `length` bytes may be read, else kTooLarge with the reason.
Decoded<bool> check_request_frame_length(std::uint64_t length, const Limits& limits);
Decoded<bool> check_response_frame_length(std::uint64_t length, std::size_t max_value_bytes);

// Decodes a body (without its header). Checks field lengths and per-op shape; trailing bytes are
// a bad request.
Decoded<Request> decode_request_body(std::string_view body, const Limits& limits);
Decoded<Response> decode_response_body(std::string_view body, std::size_t max_value_bytes);

// ADD deltas and results travel as 8-byte two's-complement little-endian values.
std::string encode_i64(std::int64_t v);
bool decode_i64(std::string_view bytes, std::int64_t* out);

// Compares in time that depends only on the lengths, never on where the inputs first differ;
// a length mismatch is folded into the result instead of returning early.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace weightcast::comm::store_protocol
