// Wire protocol of torch's c10d TCPStore, both generations, as pure encode/decode functions over
// byte buffers (no sockets, no global state), shared by C10dStoreServer and C10dStore and drivable
// by a fuzzer. Lifetime: stateless. Threading: every function is reentrant.
//
// Framing (torch/csrc/distributed/c10d/Utils.hpp, TCPStore.cpp; docs/interop_store_notes.md):
// a request is one query byte, then its arguments, with no total length. Strings and byte vectors
// are a u64 length and the raw bytes; integers are raw little-endian; key lists are a u64 count and
// the keys; MULTI_SET carries an i64 count and (key, value) pairs. The query byte depends on the
// generation (kTorch1: SET=0 ... DELETE_KEY=8; kTorch2: VALIDATE=0, SET=1 ... PING=13).
//
// Bounds. decode_request() reads a growing stream buffer: it answers kNeedMore until one whole
// request is there, and kBad as soon as a claimed length, count or the request's total size is
// over its limit, before anything of that size is allocated or waited for. So a server buffers at
// most Limits::max_request_bytes per connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::comm::c10d_protocol {

enum class Generation : std::uint8_t { kTorch1, kTorch2 };

// Generation-independent names; query_byte() maps them onto each generation's numbering.
enum class Query : std::uint8_t {
  kValidate,  // 2.x: u32 magic; must open every 2.x connection; no reply
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,  // 1.x only (the callback socket); not served
  kDeleteKey,
  kAppend,      // 2.x only
  kMultiGet,    // 2.x only
  kMultiSet,    // 2.x only
  kCancelWait,  // 2.x only
  kPing,        // 2.x only: u32 nonce, echoed
};

inline constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;
inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;  // 2.x only

const char* query_name(Query q);
const char* generation_name(Generation g);

// The byte `q` is sent as in generation `g`; nullopt when `g` has no such query.
std::optional<std::uint8_t> query_byte(Generation g, Query q);
// The query a byte means in generation `g`; nullopt for an unknown byte.
std::optional<Query> query_from_byte(Generation g, std::uint8_t byte);

struct Limits {
  std::size_t max_key_bytes = 8u << 10;
  std::size_t max_value_bytes = 8u << 20;
  std::size_t max_keys_per_request = 128u << 10;
  std::size_t max_request_bytes = 32u << 20;  // one whole request, all fields together
};

// One request. Which fields a query uses:
//   SET, APPEND: keys[0], values[0]     COMPARE_SET: keys[0], values = {expected, desired}
//   GET, DELETE_KEY, WATCH_KEY: keys[0] ADD: keys[0], delta
//   CHECK, WAIT, MULTI_GET: keys        MULTI_SET: keys, values (same count)
//   VALIDATE: word = magic              PING: word = nonce
//   GETNUMKEYS, CANCEL_WAIT: nothing
struct Request {
  Query query = Query::kGetNumKeys;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::int64_t delta = 0;
  std::uint32_t word = 0;

  bool operator==(const Request&) const = default;
};

// Encodes `req` for generation `g`; EnforceError when `g` lacks the query or the fields do not
// match it (a caller bug).
std::string encode_request(Generation g, const Request& req);

enum class Decode : std::uint8_t { kDone, kNeedMore, kBad };

struct DecodeResult {
  Decode status = Decode::kNeedMore;
  std::size_t consumed = 0;  // kDone: bytes of `buffer` the request used
  Request request;           // kDone only
  std::string error;         // kBad: what was wrong, naming the field
};

// Decodes the first request at the start of `buffer` (a stream: more may follow).
DecodeResult decode_request(Generation g, std::string_view buffer, const Limits& limits);

// How a server tells the generation of a new connection from its first bytes: a 2.x client opens
// with VALIDATE (0x00 then the magic); a 1.x byte 0 is SET, whose u64 key length could only start
// with the magic for a key of over a gigabyte. nullopt: fewer than 5 bytes and the first is 0.
std::optional<Generation> detect_generation(std::string_view first_bytes);

// Reply pieces.
void append_u8(std::string* out, std::uint8_t v);
void append_u32(std::string* out, std::uint32_t v);
void append_i64(std::string* out, std::int64_t v);
void append_u64(std::string* out, std::uint64_t v);
void append_bytes(std::string* out, std::string_view v);  // u64 length + bytes

std::uint32_t read_u32(const char* p);
std::uint64_t read_u64(const char* p);
std::int64_t read_i64(const char* p);

}  // namespace weightcast::comm::c10d_protocol
