// Text checks shared by the protocol vocabulary: quoting untrusted values for error messages,
// parsing enum names, UTF-8 validation, and the rule for identifiers (tensor names, group names,
// versions).
//
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "comm/enum_names.h"
#include "comm/errors.h"

namespace weightcast::sync {

// `text` in single quotes, cut to a bounded length and with control and non-ASCII bytes shown as
// \xNN, so a hostile value cannot flood a log line, inject terminal sequences or break the
// UTF-8 of an error response.
std::string quoted(std::string_view text);
// Exact-match overloads (the char* one resolves the ambiguity the others create for literals): with
// a std::string argument, argument-dependent lookup also finds std::quoted (<iomanip>), which would
// otherwise win over the string_view conversion.
inline std::string quoted(const std::string& text) {
  return quoted(std::string_view(text));
}
inline std::string quoted(std::string& text) {
  return quoted(std::string_view(text));
}
inline std::string quoted(const char* text) {
  return quoted(std::string_view(text));
}

// The value of `names` spelled exactly `text`. Anything else throws Error (by default
// comm::BadRequestError): "unknown <kind> 'text' (valid: <names><also>)".
template <typename Error = comm::BadRequestError, typename E, std::size_t N>
E parse_name(const comm::EnumNames<E, N>& names, std::string_view text,
             std::string_view also = {}) {
  if (auto value = names.find(text)) return *value;
  throw Error("unknown " + std::string(names.kind()) + " " + quoted(text) +
              " (valid: " + names.list() + std::string(also) + ")");
}

// Offset of the first byte that is not part of well-formed UTF-8 (overlong forms, surrogates
// and code points above U+10FFFF are ill-formed), or npos when all of `text` is well-formed.
std::size_t find_invalid_utf8(std::string_view text);

// Throws comm::BadRequestError naming `field` unless `text` is a usable identifier: non-empty,
// at most `max_length` bytes, printable ASCII without whitespace (0x21..0x7e). Tensor names
// ("model.layers.0.mlp.up_proj.weight"), group names and addresses all fit; spaces and control
// bytes never appear in them and would make logs and keys ambiguous.
void validate_identifier(std::string_view text, std::size_t max_length, std::string_view field);

}  // namespace weightcast::sync
