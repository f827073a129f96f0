// Fuzz target for every parse_* of sync/protocol/protocol.h (the nine request readers the engine
// runs on untrusted HTTP bodies and the six response readers the trainer runs on engine answers).
//
// Input: byte 0 picks the parser (low nibble modulo the count) and the limits (bit 4: tight
// limits, so the size, depth and count checks are reached with short inputs); the rest is the
// body. Properties checked on every input:
//   - a parser either returns or throws comm::BadRequestError; anything else (another exception,
//     a sanitizer report, a crash) is a finding;
//   - what it returns is inside the schema: writing it with to_json_string() and reading that
//     back gives the same value (so the engine and the trainer cannot disagree about a body);
//   - a bucket request's tensors fit the limits: total_bytes() <= max_bucket_bytes, and the
//     bucket plan the engine builds from them (make_bucket) stays consistent.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>

#include "comm/errors.h"
#include "fuzz/fuzz_check.h"
#include "sync/model/bucket.h"
#include "sync/protocol/bucket_request.h"
#include "sync/protocol/protocol.h"

namespace {

using namespace weightcast::sync;

ProtocolLimits tight_limits() {
  ProtocolLimits l;
  l.max_body_bytes = 4096;
  l.max_json_depth = 4;
  l.max_names_per_bucket = 4;
  l.max_bucket_bytes = 4096;
  l.max_name_length = 24;
  l.max_string_length = 24;
  l.max_list_entries = 4;
  return l;
}

// The writer's output goes back through the same reader. The body limit is lifted for the
// re-read because the writer spells out defaulted fields the input may have left out.
template <typename T, typename Parse>
void round_trip(const T& value, Parse parse, ProtocolLimits limits) {
  limits.max_body_bytes = ProtocolLimits{}.max_body_bytes;
  const std::string text = to_json_string(value);
  T again{};
  try {
    again = parse(text, limits);
  } catch (const weightcast::comm::BadRequestError& e) {
    std::fprintf(stderr, "re-read of %s failed: %s\n", text.c_str(), e.what());
    FUZZ_CHECK(false, "the reader refuses what the writer wrote");
  }
  FUZZ_CHECK(again == value, "write then read changed the value");
}

void check_bucket(const UpdateWeightsFromDistributedRequest& r, const ProtocolLimits& limits) {
  FUZZ_CHECK(!r.tensors.empty(), "a bucket request without tensors was accepted");
  FUZZ_CHECK(r.tensors.size() <= limits.max_names_per_bucket, "more names than the limit");
  const std::size_t total = r.total_bytes();
  FUZZ_CHECK(total <= limits.max_bucket_bytes, "bucket bytes over the limit were accepted");
  BucketPlan plan;
  try {
    plan = make_bucket(r.sequence.value_or(0), r.tensors);
  } catch (const weightcast::comm::BadRequestError&) {
    return;  // alignment padding overflowed: the engine answers 400 too
  }
  FUZZ_CHECK(plan.entries.size() == r.tensors.size(), "plan lost tensors");
  std::size_t end = 0;
  for (const BucketEntry& e : plan.entries) {
    FUZZ_CHECK(e.offset >= end || e.bytes == 0, "plan entries overlap");
    FUZZ_CHECK(e.offset + e.bytes <= plan.total_bytes, "plan entry past the bucket's end");
    end = e.offset + e.bytes;
  }
  FUZZ_CHECK(plan.total_bytes >= total, "plan smaller than its tensors");
}

// The bucket request's SAX pass takes only bodies its DOM reader takes, and reads them the same.
void check_bucket_readers(std::string_view body, const ProtocolLimits& limits) {
  const auto fast = read_bucket_request_fast(body, limits);
  if (!fast) return;
  UpdateWeightsFromDistributedRequest dom;
  try {
    dom = read_bucket_request_dom(body, limits);
  } catch (const weightcast::comm::BadRequestError&) {
    FUZZ_CHECK(false, "the SAX pass took a body the DOM reader refuses");
  }
  FUZZ_CHECK(*fast == dom, "the two bucket readers disagree");
}

template <typename Parse>
void run(Parse parse, std::string_view body, const ProtocolLimits& limits) {
  if constexpr (std::is_same_v<std::decay_t<decltype(parse(body, limits))>,
                               UpdateWeightsFromDistributedRequest>) {
    check_bucket_readers(body, limits);
  }
  try {
    const auto value = parse(body, limits);
    round_trip(value, parse, limits);
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>,
                                 UpdateWeightsFromDistributedRequest>) {
      check_bucket(value, limits);
    }
  } catch (const weightcast::comm::BadRequestError&) {
    // The documented refusal: the engine answers it with a 400.
  }
}

// run() for one parser, as a plain function so that every parser fits one table.
template <auto parse>
void run_parser(std::string_view body, const ProtocolLimits& limits) {
  run(parse, body, limits);
}

// Byte 0 picks by index (kept stable: the seed corpus relies on it): the nine request readers,
// then the six response readers.
constexpr void (*kParsers[])(std::string_view, const ProtocolLimits&) = {
    run_parser<&parse_init_weights_update_group>,
    run_parser<&parse_destroy_weights_update_group>,
    run_parser<&parse_pause_generation>,
    run_parser<&parse_continue_generation>,
    run_parser<&parse_flush_cache>,
    run_parser<&parse_begin_weight_update>,
    run_parser<&parse_update_weights_from_distributed>,
    run_parser<&parse_update_weight_version>,
    run_parser<&parse_end_weight_update>,
    run_parser<&parse_basic_response>,
    run_parser<&parse_spec_accept_length_response>,
    run_parser<&parse_begin_weight_update_response>,
    run_parser<&parse_end_weight_update_response>,
    run_parser<&parse_server_info_response>,
    run_parser<&parse_weights_checksum_response>,
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t which = (data[0] & 0x0fu) % std::size(kParsers);
  const bool tight = (data[0] & 0x10u) != 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kParsers[which](body, tight ? tight_limits() : ProtocolLimits{});
  return 0;
}
