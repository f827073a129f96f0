// POST /update_weights_from_distributed: reading the bucket request's body. A bucket of experts
// lists thousands of tensors, so one SAX pass takes names / dtypes / shapes / digests straight
// into typed lists and keeps the other fields as a DOM. Anything it does not expect (a wrong
// type, a duplicate key, a limit crossed, a syntax error, a value the checks refuse) makes it give
// up, and the DOM path reads the body again and reports the error. Both paths run the same checks
// (read_bucket_tensors over DomLists or TypedLists), so they accept the same bodies and produce
// the same request. Writing it is to_json_string in protocol.cc.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "sync/protocol/bucket_request.h"
#include "sync/protocol/protocol.h"
#include "sync/protocol/protocol_fields.h"
#include "sync/protocol/protocol_json.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

using wire::fail;
using wire::indexed;
using wire::Json;

// The tensor lists of a body read into a DOM: element i of each, checked as it is read.
class DomLists {
 public:
  DomLists(const wire::FieldReader& r, const ProtocolLimits& limits)
      : names_(wire::as_array(r.required("names"), "names", limits.max_names_per_bucket)),
        dtypes_(wire::as_array(r.required("dtypes"), "dtypes", limits.max_names_per_bucket)),
        shapes_(wire::as_array(r.required("shapes"), "shapes", limits.max_names_per_bucket)),
        max_name_(limits.max_name_length) {}

  std::size_t names() const { return names_.size(); }
  std::size_t dtypes() const { return dtypes_.size(); }
  std::size_t shapes() const { return shapes_.size(); }
  // Paths like "names[3]" are spelled out only for an error (wire::Path).
  std::string name(std::size_t i) const {
    return wire::as_identifier(names_[i], wire::Path("names", i), max_name_);
  }
  DType dtype(std::size_t i) const {
    return wire::as_enum(dtypes_[i], wire::Path("dtypes", i), parse_dtype);
  }
  std::vector<std::int64_t> shape(std::size_t i) const {
    return wire::read_shape(shapes_[i], wire::Path("shapes", i));
  }

 private:
  const Json& names_;
  const Json& dtypes_;
  const Json& shapes_;
  std::size_t max_name_;
};

// The tensor lists as the SAX pass read them: strings and integer lists, taken once each. The
// type checks happened while reading; the content checks are these, without paths (a refusal
// sends the body down the DOM path, which names the field).
struct TypedLists {
  std::vector<std::string> names_, dtypes_, digests_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::size_t max_name_ = 0;

  std::size_t names() const { return names_.size(); }
  std::size_t dtypes() const { return dtypes_.size(); }
  std::size_t shapes() const { return shapes_.size(); }
  std::string name(std::size_t i) {
    validate_identifier(names_[i], max_name_, {});
    return std::move(names_[i]);
  }
  DType dtype(std::size_t i) const { return parse_dtype(dtypes_[i]); }
  std::vector<std::int64_t> shape(std::size_t i) { return std::move(shapes_[i]); }
};

// names / dtypes / shapes -> TensorMeta, checking lengths, uniqueness and sizes against the
// limits before the caller can allocate anything for the bucket.
template <typename Lists>
std::vector<TensorMeta> read_bucket_tensors(Lists& lists, const ProtocolLimits& limits) {
  const std::size_t n = lists.names();
  if (n == 0) fail("names", "must list at least one tensor");
  for (const auto& [field, size] :
       {std::pair{"dtypes", lists.dtypes()}, std::pair{"shapes", lists.shapes()}}) {
    if (size != n) {
      fail(field, std::to_string(size) + " entries, but names has " + std::to_string(n));
    }
  }
  std::vector<TensorMeta> tensors;
  tensors.reserve(n);  // no reallocation: `unique` keeps views of the names
  wire::UniqueNameViews unique("names");
  unique.reserve(n);
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    TensorMeta& t = tensors.emplace_back();
    t.name = lists.name(i);
    unique.add(t.name, i);
    t.dtype = lists.dtype(i);
    t.shape = lists.shape(i);
    const auto valid = valid_byte_count(t.dtype, t.shape);
    const std::size_t bytes =
        valid ? *valid : checked_byte_count(t.dtype, t.shape, indexed("shapes", i));
    if (bytes > limits.max_bucket_bytes - total) {
      fail(wire::Path("shapes", i), "bucket size through tensor " + quoted(t.name) +
                                        " exceeds the limit of " +
                                        std::to_string(limits.max_bucket_bytes) + " bytes");
    }
    total += bytes;
  }
  return tensors;
}

bool is_digest_text(const std::string& text) {
  return text.size() == 32 && text.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
}

// A list of XXH3-128 digests (32 hex digits each), one per tensor of the bucket.
std::vector<std::string> read_digests(const Json& v, const std::string& field, std::size_t tensors,
                                      const ProtocolLimits& limits) {
  const Json& digests = wire::as_array(v, field, limits.max_names_per_bucket);
  if (digests.size() != tensors) {
    fail(field,
         std::to_string(digests.size()) + " entries, but names has " + std::to_string(tensors));
  }
  std::vector<std::string> out;
  out.reserve(digests.size());
  for (std::size_t i = 0; i < digests.size(); ++i) {
    const wire::Path path(field, i);
    std::string text = wire::as_text(digests[i], path, 32);
    if (!is_digest_text(text)) fail(path, "must be 32 hex digits (got " + quoted(text) + ")");
    out.push_back(std::move(text));
  }
  return out;
}

// The optional "delta" object of a bucket request; `tensors` is the number of names.
std::optional<BucketDelta> read_bucket_delta(const wire::FieldReader& r, LoadFormat format,
                                             std::size_t tensors, const ProtocolLimits& limits) {
  const Json* v = r.optional("delta");
  if (v == nullptr) return std::nullopt;
  if (format != LoadFormat::kWeightcastBucket) {
    fail("delta", "delta buckets need load_format weightcast_bucket (got " +
                      std::string(to_string(format)) + ")");
  }
  if (!v->is_object()) fail("delta", "must be an object");
  const wire::FieldReader d(*v, "delta.");
  BucketDelta out;
  out.codec = wire::as_enum(d.required("codec"), "delta.codec", parse_delta_codec);
  out.wire_bytes = wire::as_uint(d.required("wire_bytes"), "delta.wire_bytes");
  if (out.wire_bytes == 0 || out.wire_bytes > limits.max_bucket_bytes) {
    fail("delta.wire_bytes", "must be in [1, " + std::to_string(limits.max_bucket_bytes) +
                                 "] (got " + std::to_string(out.wire_bytes) + ")");
  }
  out.base_version =
      wire::as_text(d.required("base_version"), "delta.base_version", limits.max_string_length);
  out.base_digests =
      read_digests(d.required("base_digests"), "delta.base_digests", tensors, limits);
  return out;
}

// Every field but the tensor lists and digests, from `r` (the whole body, or the SAX pass's
// other fields). Cheap scalar fields first, so a wrong selector or format is reported without
// walking the tensor lists.
UpdateWeightsFromDistributedRequest read_scalars(const wire::FieldReader& r,
                                                 const ProtocolLimits& limits) {
  UpdateWeightsFromDistributedRequest out;
  if (r.optional("selector")) out.selector = wire::read_selector(r);
  if (const Json* v = r.optional("sequence")) out.sequence = wire::as_uint(*v, "sequence");
  out.load_format = LoadFormat::kPerTensor;
  if (const Json* v = r.optional("load_format")) {
    out.load_format = wire::as_enum(*v, "load_format", parse_load_format);
  }
  out.group_name = wire::read_group_name(r, limits);
  out.flush_cache = r.boolean_or("flush_cache", true);
  out.abort_all_requests = r.boolean_or("abort_all_requests", false);
  out.torch_empty_cache = r.boolean_or("torch_empty_cache", false);
  if (const Json* v = r.optional("weight_version")) {
    out.weight_version = wire::as_text(*v, "weight_version", limits.max_string_length);
  }
  out.session_id = wire::read_session_text(r, "session_id", limits);
  return out;
}

// SAX events of a bucket request: the four lists into TypedLists, every other top-level field
// into `rest` (a DOM, as nlohmann's own DOM parser builds it). Returning false stops the parse:
// the body then goes down the DOM path.
class BucketSax {
 public:
  explicit BucketSax(const ProtocolLimits& limits) : limits_(limits) {
    lists_.max_name_ = limits.max_name_length;
  }

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) {
    if (list_ == kShapes && depth_ == 3) return dim(v);
    return put(Json(v));
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (list_ == kShapes && depth_ == 3) {
      return v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) &&
             dim(static_cast<std::int64_t>(v));
    }
    return put(Json(v));
  }
  bool number_float(Json::number_float_t v, const Json::string_t& /*text*/) { return put(Json(v)); }
  bool string(Json::string_t& v) {
    if (list_ != kNone && list_ != kShapes && depth_ == 2) {
      auto& list = strings(list_);
      if (list.size() >= limits_.max_names_per_bucket) return false;
      list.push_back(std::move(v));
      return true;
    }
    return put(Json(std::move(v)));
  }
  bool binary(Json::binary_t& /*v*/) { return false; }  // JSON text has none
  bool start_object(std::size_t /*size*/) {
    if (depth_ == 0) {
      depth_ = 1;  // the body's own object
      return true;
    }
    if (!put(Json(Json::value_t::object))) return false;
    open_.push_back(last_);
    return ++depth_ <= limits_.max_json_depth;
  }
  bool key(Json::string_t& k) {
    if (depth_ == 1) return top_key(k);
    auto& members = open_.back()->get_ref<Json::object_t&>();
    auto [it, inserted] = members.try_emplace(k);
    member_ = &it->second;
    return inserted;
  }
  bool end_object() {
    if (depth_-- > 1) open_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*size*/) {
    if (pending_ != kNone && depth_ == 1) {  // the value of one of the four lists
      list_ = std::exchange(pending_, kNone);
      depth_ = 2;
      return depth_ <= limits_.max_json_depth;
    }
    if (list_ == kShapes && depth_ == 2) {
      if (lists_.shapes_.size() >= limits_.max_names_per_bucket) return false;
      lists_.shapes_.emplace_back();
      depth_ = 3;
      return depth_ <= limits_.max_json_depth;
    }
    if (!put(Json(Json::value_t::array))) return false;
    open_.push_back(last_);
    return ++depth_ <= limits_.max_json_depth;
  }
  bool end_array() {
    if (list_ != kNone) {
      if (--depth_ == 1) list_ = kNone;
      return true;
    }
    --depth_;
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const Json::exception& /*e*/) {
    return false;
  }

  // Whether the body was one object holding the three required lists.
  bool complete() const { return depth_ == 0 && seen_[kNames] && seen_[kDtypes] && seen_[kShapes]; }
  bool has_digests() const { return seen_[kDigests]; }
  TypedLists& lists() { return lists_; }
  const Json& rest() const { return rest_; }

 private:
  enum List { kNames, kDtypes, kShapes, kDigests, kNone };

  bool top_key(const std::string& k) {
    for (List l : {kNames, kDtypes, kShapes, kDigests}) {
      if (k != kKeys[l]) continue;
      if (seen_[l]) return false;  // a duplicate: the DOM path names it
      seen_[l] = true;
      pending_ = l;
      return true;
    }
    pending_ = kNone;
    auto [it, inserted] = rest_.get_ref<Json::object_t&>().try_emplace(k);
    member_ = &it->second;
    return inserted;
  }

  std::vector<std::string>& strings(List l) {
    return l == kNames ? lists_.names_ : l == kDtypes ? lists_.dtypes_ : lists_.digests_;
  }

  bool dim(std::int64_t v) {
    auto& shape = lists_.shapes_.back();
    if (shape.size() >= kMaxShapeRank) return false;
    shape.push_back(v);
    return true;
  }

  // Places a value outside the lists: at the member of the last key read, or in the innermost
  // open array. A value where a list belongs (a list field that is not an array, or a list
  // element of the wrong type) is refused.
  bool put(Json&& value) {
    if (pending_ != kNone || list_ != kNone || depth_ == 0) return false;
    if (open_.empty() || open_.back()->is_object()) {
      *member_ = std::move(value);
      last_ = member_;
      return true;
    }
    auto& elements = open_.back()->get_ref<Json::array_t&>();
    elements.push_back(std::move(value));
    last_ = &elements.back();
    return true;
  }

  static constexpr const char* kKeys[] = {"names", "dtypes", "shapes", "digests"};

  const ProtocolLimits& limits_;
  TypedLists lists_;
  Json rest_ = Json::object();
  bool seen_[4] = {false, false, false, false};
  List pending_ = kNone;     // the list whose key was read last, until its array opens
  List list_ = kNone;        // the list being read
  std::size_t depth_ = 0;    // 1 inside the body's object
  std::vector<Json*> open_;  // open objects and arrays of `rest`, innermost last
  Json* member_ = nullptr;   // the value slot of the last key read
  Json* last_ = nullptr;     // the value placed last
};

}  // namespace

std::optional<UpdateWeightsFromDistributedRequest> read_bucket_request_fast(
    std::string_view body, const ProtocolLimits& limits) {
  if (body.size() > limits.max_body_bytes || find_invalid_utf8(body) != std::string_view::npos) {
    return std::nullopt;
  }
  BucketSax sax(limits);
  if (!Json::sax_parse(body.begin(), body.end(), &sax, Json::input_format_t::json,
                       /*strict=*/true, /*ignore_comments=*/false) ||
      !sax.complete()) {
    return std::nullopt;
  }
  try {
    UpdateWeightsFromDistributedRequest out =
        read_scalars(wire::FieldReader(sax.rest(), ""), limits);
    TypedLists& lists = sax.lists();
    out.tensors = read_bucket_tensors(lists, limits);
    out.delta = read_bucket_delta(wire::FieldReader(sax.rest(), ""), out.load_format,
                                  out.tensors.size(), limits);
    if (sax.has_digests()) {
      if (lists.digests_.size() != out.tensors.size() ||
          !std::all_of(lists.digests_.begin(), lists.digests_.end(), is_digest_text)) {
        return std::nullopt;
      }
      out.digests = std::move(lists.digests_);
    }
    return out;
  } catch (const comm::BadRequestError&) {
    return std::nullopt;
  }
}

UpdateWeightsFromDistributedRequest read_bucket_request_dom(std::string_view body,
                                                            const ProtocolLimits& limits) {
  const Json j = wire::parse_body(body, limits);
  const wire::FieldReader r(j, "");
  UpdateWeightsFromDistributedRequest out = read_scalars(r, limits);
  DomLists lists(r, limits);
  out.tensors = read_bucket_tensors(lists, limits);
  out.delta = read_bucket_delta(r, out.load_format, out.tensors.size(), limits);
  if (const Json* v = r.optional("digests")) {
    out.digests = read_digests(*v, "digests", out.tensors.size(), limits);
  }
  return out;
}

UpdateWeightsFromDistributedRequest parse_update_weights_from_distributed(
    std::string_view body, const ProtocolLimits& limits) {
  if (auto fast = read_bucket_request_fast(body, limits)) return std::move(*fast);
  return read_bucket_request_dom(body, limits);
}

}  // namespace weightcast::sync
