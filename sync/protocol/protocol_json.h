// Strict JSON reading for the protocol files (protocol.cc, protocol_responses.cc); not meant for
// other callers, who use the parse_* functions of sync/protocol/protocol.h.
//
// parse_body() turns untrusted text into a JSON object only after checking, in one pass and
// before any allocation, the body size, UTF-8 well-formedness and nesting depth; duplicate keys
// are refused while parsing so two parsers can never disagree on a value. The readers then
// extract typed fields and throw comm::BadRequestError whose message starts with the field's path
// ("shapes[3][1]: must be >= 0 (got -2)"). Unknown fields are ignored, as SGLang's request models
// ignore them, so clients that send extra SGLang fields (rid, ...) keep working.
// Lifetime: a FieldReader refers to the JSON value it was built on and must not outlive it.
// Threading: pure functions; a reader is used from one thread.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/protocol/protocol_limits.h"

namespace weightcast::sync::wire {

using Json = nlohmann::json;

// The body as a JSON object. `allow_empty`: an empty or all-whitespace body reads as {} (routes
// without fields, which clients call with no body at all).
Json parse_body(std::string_view body, const ProtocolLimits& limits, bool allow_empty = false);

// Compact text of `value`; never throws on strings that are not UTF-8 (they are replaced).
std::string dump(const Json& value);

// "names[3]": the path of element i of a list field.
inline std::string indexed(std::string_view list, std::size_t i) {
  return std::string(list) + "[" + std::to_string(i) + "]";
}

// The path of a value in errors, spelled out only when an error is thrown: a bucket request
// reads thousands of list elements, and building "names[1234]" for each one cost more than
// reading it. Either a whole path or a list's path and an index ("names", 3 is "names[3]").
// Refers to the text it was built from: use it within the call it is passed to.
class Path {
 public:
  Path(const std::string& path) : base_(path) {}  // NOLINT(google-explicit-constructor)
  Path(std::string_view path) : base_(path) {}    // NOLINT(google-explicit-constructor)
  Path(const char* path) : base_(path) {}         // NOLINT(google-explicit-constructor)
  Path(std::string_view list, std::size_t index) : base_(list), index_(index) {}

  std::string str() const { return index_ == kNone ? std::string(base_) : indexed(base_, index_); }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::string_view base_;
  std::size_t index_ = kNone;
};

// Throws comm::BadRequestError "<path>: <problem>", the shape of every protocol error.
[[noreturn]] inline void fail(const Path& path, const std::string& problem) {
  throw comm::BadRequestError(path.str() + ": " + problem);
}

// A shape: an array of at most kMaxShapeRank integers. Any int64 is read; checked_numel() then
// reports a negative one as "<path>[k]: must be >= 0".
std::vector<std::int64_t> read_shape(const Json& value, const Path& path);

// "string", "number", "array", ...: for messages.
std::string_view type_name(const Json& value);

// Element readers: `path` names the value in errors.
std::string as_string(const Json& value, const Path& path);
bool as_bool(const Json& value, const Path& path);
std::int64_t as_int(const Json& value, const Path& path, std::int64_t min, std::int64_t max);
std::uint64_t as_uint(const Json& value, const Path& path,
                      std::uint64_t max = std::numeric_limits<std::uint64_t>::max());
// An array with at most `max_entries` entries.
const Json& as_array(const Json& value, const Path& path, std::size_t max_entries);
// Strings with content rules: identifiers (printable ASCII, no whitespace) and free text (no
// control bytes); both non-empty and at most `max_length` bytes.
std::string as_identifier(const Json& value, const Path& path, std::size_t max_length);
std::string as_text(const Json& value, const Path& path, std::size_t max_length);

// Reads the fields of one object. `prefix` is prepended to field names in errors
// ("runners[1]." gives "runners[1].layout: ...").
class FieldReader {
 public:
  FieldReader(const Json& object, std::string prefix);

  std::string path(std::string_view key) const { return prefix_ + std::string(key); }
  // The value of `key`, or nullptr when absent. JSON null counts as absent only for fields
  // SGLang declares Optional; required() and the typed getters treat null as a wrong type.
  const Json* find(std::string_view key) const;
  // The value of `key`; throws "<path>: missing required field" when absent.
  const Json& required(std::string_view key) const;
  // Like find(), but a JSON null also reads as absent (SGLang's Optional[...] fields).
  const Json* optional(std::string_view key) const;

  bool boolean(std::string_view key) const { return as_bool(required(key), path(key)); }
  bool boolean_or(std::string_view key, bool fallback) const;

 private:
  const Json& object_;
  std::string prefix_;
};

// A string naming a member of a closed vocabulary, read with `parse` (parse_selector,
// parse_dtype, ...), whose BadRequestError gets the path prefixed. The type check comes first,
// outside the prefixing, so its message names the path once.
template <typename Parse>
auto as_enum(const Json& value, const Path& path, Parse&& parse) {
  if (!value.is_string()) (void)as_string(value, path);  // throws the type error
  try {
    return parse(value.template get_ref<const std::string&>());
  } catch (const comm::BadRequestError& e) {
    throw comm::BadRequestError(path.str() + ": " + e.what());
  }
}

// Tracks names seen in one list; throws "<path>: duplicate of <first path> ('name')".
// UniqueNames copies each name; UniqueNameViews keeps views, for lists of thousands of names
// whose strings outlive it (a bucket's tensors, reserved before the first is read).
template <typename Key>
class BasicUniqueNames {
 public:
  explicit BasicUniqueNames(std::string list_path) : list_path_(std::move(list_path)) {}
  void reserve(std::size_t names) { first_.reserve(names); }
  void add(std::string_view name, std::size_t index) {
    const auto [it, inserted] = first_.emplace(Key(name), index);
    if (!inserted) duplicate(name, index, it->second);
  }

 private:
  [[noreturn]] void duplicate(std::string_view name, std::size_t index, std::size_t first) const;

  std::string list_path_;
  std::unordered_map<Key, std::size_t> first_;
};
using UniqueNames = BasicUniqueNames<std::string>;
using UniqueNameViews = BasicUniqueNames<std::string_view>;

// Throws "<path>: must be <what> (got <type>)" when `value` is not an object; returns a reader.
FieldReader as_object(const Json& value, const Path& path);

}  // namespace weightcast::sync::wire

namespace weightcast::sync {

struct RunnerInfo;
// One entry of /server_info's "runners" list: the one reader, shared by every answer that lists
// runners (ours and the SGLang plug-in's announce).
RunnerInfo read_runner_info(const wire::Json& value, const std::string& path,
                            const ProtocolLimits& limits);

}  // namespace weightcast::sync
