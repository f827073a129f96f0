// Fuzz target for the TCP store's wire protocol decoder (comm/store/store_protocol.h): the code a
// store server runs on bytes from any peer that can reach its port, and a client on the server's
// answers.
//
// Input: byte 0 picks the mode (bits 0-1) and the value limit (bit 2: 16 bytes, else 64 KiB);
// the rest is
//   mode 0: one request body;  mode 1: one response body;
//   mode 2: a byte stream of request frames as a server reads it (length check before the body,
//           a refused or malformed frame ends the connection, as in the server);
//   mode 3: the same for response frames as a client reads them.
// Properties: decoding never reads past the input or allocates for a length it has not checked
// (the sanitizers and the frame-length checks catch both); whatever decodes satisfies the
// documented limits and per-op shape; re-encoding a decoded message gives back exactly the bytes
// it came from (the format is canonical, so two implementations cannot read one frame two ways);
// constant_time_equal agrees with ==.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "comm/store.h"
#include "comm/store/store_protocol.h"
#include "fuzz/fuzz_check.h"

namespace {

namespace proto = weightcast::comm::store_protocol;
using weightcast::comm::Store;

void check_request(const proto::Request& r, std::string_view body, const proto::Limits& limits) {
  FUZZ_CHECK(r.keys.size() <= limits.max_keys, "more keys than the limit");
  for (const auto& k : r.keys) {
    FUZZ_CHECK(!k.empty() && k.size() <= Store::kMaxKeyBytes, "key length out of bounds");
  }
  FUZZ_CHECK(r.value.size() <= limits.max_value_bytes, "value over the limit");
  if (r.op == proto::Op::kAdd) {
    std::int64_t delta = 0;
    FUZZ_CHECK(proto::decode_i64(r.value, &delta), "ADD accepted without an 8-byte delta");
    FUZZ_CHECK(proto::encode_i64(delta) == r.value, "i64 round trip");
  }
  if (r.op != proto::Op::kWait) FUZZ_CHECK(r.keys.size() == 1, "single-key op with other keys");
  const std::string frame = proto::encode_request(r);
  FUZZ_CHECK(frame.size() == proto::kFrameHeaderBytes + body.size(), "re-encoded size differs");
  FUZZ_CHECK(proto::decode_frame_length(frame) == body.size(), "re-encoded header differs");
  FUZZ_CHECK(std::string_view(frame).substr(proto::kFrameHeaderBytes) == body,
             "re-encoded request differs from the bytes it was decoded from");
}

void check_response(const proto::Response& r, std::string_view body, std::size_t max_value) {
  FUZZ_CHECK(r.message.size() <= proto::kMaxMessageBytes, "message over the limit");
  FUZZ_CHECK(r.value.size() <= std::max<std::size_t>(max_value, 8), "value over the limit");
  (void)proto::status_name(r.status);
  (void)proto::keeps_connection(r.status);
  const std::string frame = proto::encode_response(r);
  FUZZ_CHECK(std::string_view(frame).substr(proto::kFrameHeaderBytes) == body,
             "re-encoded response differs from the bytes it was decoded from");
}

void decode_request(std::string_view body, const proto::Limits& limits) {
  auto d = proto::decode_request_body(body, limits);
  if (d.ok()) {
    check_request(d.value, body, limits);
    (void)proto::op_name(d.value.op);
  } else {
    FUZZ_CHECK(d.status == proto::Status::kBadRequest || d.status == proto::Status::kTooLarge,
               "a refusal other than bad request / too large");
    FUZZ_CHECK(!d.error.empty(), "a refusal without a reason");
  }
}

void decode_response(std::string_view body, std::size_t max_value) {
  auto d = proto::decode_response_body(body, max_value);
  if (d.ok()) check_response(d.value, body, max_value);
}

// Frame after frame, as the server's connection loop reads them; stops where it would close.
void request_stream(std::string_view bytes, const proto::Limits& limits) {
  while (bytes.size() >= proto::kFrameHeaderBytes) {
    const std::uint32_t length = proto::decode_frame_length(bytes);
    if (!proto::check_request_frame_length(length, limits).ok()) return;
    bytes.remove_prefix(proto::kFrameHeaderBytes);
    if (bytes.size() < length) return;  // half a frame: the server waits, then times out
    const auto d = proto::decode_request_body(bytes.substr(0, length), limits);
    if (!d.ok()) return;
    check_request(d.value, bytes.substr(0, length), limits);
    bytes.remove_prefix(length);
  }
}

void response_stream(std::string_view bytes, std::size_t max_value) {
  while (bytes.size() >= proto::kFrameHeaderBytes) {
    const std::uint32_t length = proto::decode_frame_length(bytes);
    if (!proto::check_response_frame_length(length, max_value).ok()) return;
    bytes.remove_prefix(proto::kFrameHeaderBytes);
    if (bytes.size() < length) return;
    const auto d = proto::decode_response_body(bytes.substr(0, length), max_value);
    if (!d.ok()) return;
    check_response(d.value, bytes.substr(0, length), max_value);
    if (!proto::keeps_connection(d.value.status)) return;
    bytes.remove_prefix(length);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned mode = data[0] & 0x3u;
  proto::Limits limits;
  limits.max_value_bytes = (data[0] & 0x4u) ? 16 : (64u << 10);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (mode) {
    case 0:
      decode_request(rest, limits);
      break;
    case 1:
      decode_response(rest, limits.max_value_bytes);
      break;
    case 2:
      request_stream(rest, limits);
      break;
    default:
      response_stream(rest, limits.max_value_bytes);
      break;
  }
  const std::string_view a = rest.substr(0, rest.size() / 2);
  const std::string_view b = rest.substr(rest.size() / 2);
  FUZZ_CHECK(proto::constant_time_equal(a, b) == (a == b), "constant_time_equal disagrees");
  return 0;
}
