#include "sync/protocol/protocol_json.h"

#include <functional>
#include <unordered_set>
#include <vector>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"
#include "sync/protocol/tensor.h"

namespace weightcast::sync::wire {
namespace {

bool is_json_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// One pass over the raw text, before nlohmann allocates anything: nesting depth of brackets
// outside strings. Malformed JSON may be miscounted here; the parser rejects it right after.
void check_depth(std::string_view body, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped byte cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        fail("body", "JSON nested deeper than the limit of " + std::to_string(max_depth) +
                         " (at byte offset " + std::to_string(i) + ")");
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
}

// Rejects a key that repeats within one object: nlohmann would keep the last, other parsers the
// first, and a proxy and the engine could then read different selectors from one body.
class DuplicateKeyGuard {
 public:
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys_.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys_.empty()) keys_.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_.empty() && !keys_.back().insert(parsed.get<std::string>()).second) {
          fail("body", "duplicate key " + quoted(parsed.get<std::string>()));
        }
        break;
      default:
        break;
    }
    return true;
  }

 private:
  std::vector<std::unordered_set<std::string>> keys_;
};

}  // namespace

Json parse_body(std::string_view body, const ProtocolLimits& limits, bool allow_empty) {
  if (body.size() > limits.max_body_bytes) {
    fail("body", std::to_string(body.size()) + " bytes, larger than the limit of " +
                     std::to_string(limits.max_body_bytes));
  }
  if (const std::size_t bad = find_invalid_utf8(body); bad != std::string_view::npos) {
    fail("body", "not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  }
  bool blank = true;
  for (char c : body) blank = blank && is_json_space(c);
  if (blank) {
    if (allow_empty) return Json::object();
    fail("body", "empty; expected a JSON object");
  }
  check_depth(body, limits.max_json_depth);
  Json value;
  try {
    DuplicateKeyGuard guard;
    value = Json::parse(body.begin(), body.end(), std::ref(guard), /*allow_exceptions=*/true,
                        /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    fail("body", std::string("invalid JSON: ") + e.what());
  }
  if (!value.is_object())
    fail("body", "must be a JSON object (got " + std::string(type_name(value)) + ")");
  return value;
}

std::string dump(const Json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string_view type_name(const Json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "non-integer number";
  return value.type_name();
}

std::string as_string(const Json& value, const Path& path) {
  if (!value.is_string())
    fail(path, "must be a string (got " + std::string(type_name(value)) + ")");
  return value.get<std::string>();
}

bool as_bool(const Json& value, const Path& path) {
  if (!value.is_boolean()) {
    fail(path, "must be a boolean (got " + std::string(type_name(value)) + ")");
  }
  return value.get<bool>();
}

std::int64_t as_int(const Json& value, const Path& path, std::int64_t min, std::int64_t max) {
  // The range's text is built only for an error: shapes read thousands of integers.
  const auto range = [&] { return "[" + std::to_string(min) + ", " + std::to_string(max) + "]"; };
  if (!value.is_number_integer()) {
    fail(path, "must be an integer in " + range() + " (got " + std::string(type_name(value)) + ")");
  }
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (max < 0 || u > static_cast<std::uint64_t>(max)) {
      fail(path, "must be in " + range() + " (got " + std::to_string(u) + ")");
    }
    const auto v = static_cast<std::int64_t>(u);
    if (v < min) fail(path, "must be in " + range() + " (got " + std::to_string(v) + ")");
    return v;
  }
  const auto v = value.get<std::int64_t>();
  if (v < min || v > max) fail(path, "must be in " + range() + " (got " + std::to_string(v) + ")");
  return v;
}

std::uint64_t as_uint(const Json& value, const Path& path, std::uint64_t max) {
  const auto range = [&] { return "[0, " + std::to_string(max) + "]"; };
  if (!value.is_number_integer()) {
    fail(path, "must be an integer in " + range() + " (got " + std::string(type_name(value)) + ")");
  }
  if (!value.is_number_unsigned()) {
    fail(path,
         "must be in " + range() + " (got " + std::to_string(value.get<std::int64_t>()) + ")");
  }
  const auto u = value.get<std::uint64_t>();
  if (u > max) fail(path, "must be in " + range() + " (got " + std::to_string(u) + ")");
  return u;
}

const Json& as_array(const Json& value, const Path& path, std::size_t max_entries) {
  if (!value.is_array()) fail(path, "must be an array (got " + std::string(type_name(value)) + ")");
  if (value.size() > max_entries) {
    fail(path, std::to_string(value.size()) + " entries, more than the limit of " +
                   std::to_string(max_entries));
  }
  return value;
}

std::string as_identifier(const Json& value, const Path& path, std::size_t max_length) {
  if (!value.is_string()) (void)as_string(value, path);  // throws the type error
  const auto& s = value.get_ref<const std::string&>();
  try {
    validate_identifier(s, max_length, {});  // the path is spelled out only for an error
  } catch (const comm::BadRequestError&) {
    validate_identifier(s, max_length, path.str());  // throws the same error, with the path
  }
  return s;
}

std::string as_text(const Json& value, const Path& path, std::size_t max_length) {
  std::string s = as_string(value, path);
  if (s.empty()) fail(path, "must not be empty");
  if (s.size() > max_length) {
    fail(path, std::to_string(s.size()) + " bytes, longer than the limit of " +
                   std::to_string(max_length));
  }
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) fail(path, quoted(s) + " contains a control character");
  }
  return s;
}

FieldReader::FieldReader(const Json& object, std::string prefix)
    : object_(object), prefix_(std::move(prefix)) {
  WC_ENFORCE(object_.is_object(), "FieldReader needs a JSON object");
}

const Json* FieldReader::find(std::string_view key) const {
  const auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

const Json& FieldReader::required(std::string_view key) const {
  const Json* v = find(key);
  if (v == nullptr) fail(path(key), "missing required field");
  return *v;
}

const Json* FieldReader::optional(std::string_view key) const {
  const Json* v = find(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

bool FieldReader::boolean_or(std::string_view key, bool fallback) const {
  const Json* v = find(key);
  return v == nullptr ? fallback : as_bool(*v, path(key));
}

template <typename Key>
void BasicUniqueNames<Key>::duplicate(std::string_view name, std::size_t index,
                                      std::size_t first) const {
  fail(list_path_ + "[" + std::to_string(index) + "]",
       "duplicate of " + list_path_ + "[" + std::to_string(first) + "] (" + quoted(name) + ")");
}

template class BasicUniqueNames<std::string>;
template class BasicUniqueNames<std::string_view>;

FieldReader as_object(const Json& value, const Path& path) {
  if (!value.is_object()) {
    fail(path, "must be an object (got " + std::string(type_name(value)) + ")");
  }
  std::string prefix = path.str();
  return FieldReader(value, prefix.empty() ? prefix : prefix + ".");
}

std::vector<std::int64_t> read_shape(const Json& value, const Path& path) {
  const Json& dims = as_array(value, path, kMaxShapeRank);
  std::vector<std::int64_t> shape;
  shape.reserve(dims.size());
  for (std::size_t k = 0; k < dims.size(); ++k) {
    const Json& dim = dims[k];
    // Any int64 is a valid read (nlohmann keeps non-negative integers as unsigned).
    if (dim.is_number_unsigned()) {
      if (const auto u = dim.get<std::uint64_t>();
          u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        shape.push_back(static_cast<std::int64_t>(u));
        continue;
      }
    } else if (dim.is_number_integer()) {
      shape.push_back(dim.get<std::int64_t>());
      continue;
    }
    shape.push_back(as_int(dim, indexed(path.str(), k), std::numeric_limits<std::int64_t>::min(),
                           std::numeric_limits<std::int64_t>::max()));
  }
  return shape;
}

}  // namespace weightcast::sync::wire
