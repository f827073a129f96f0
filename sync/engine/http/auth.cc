#include "sync/engine/http/auth.h"

#include <cstddef>

namespace weightcast::sync::engine {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Walk the longer string in full whatever the contents; the length difference is folded into
  // the accumulator so a shorter candidate cannot match a prefix.
  const std::size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= static_cast<unsigned>(x ^ y);
  }
  // Keep the compiler from turning the loop into an early-exit comparison.
  volatile unsigned sink = diff;
  return sink == 0;
}

AuthResult check_bearer(std::optional<std::string_view> header, std::string_view token) {
  if (token.empty()) return AuthResult::kOk;
  if (!header) return AuthResult::kMissing;
  constexpr std::string_view kScheme = "Bearer ";
  std::string_view value = *header;
  if (value.size() < kScheme.size()) return AuthResult::kMissing;
  // The scheme is case-insensitive (RFC 7235); the token is not.
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    const char c = value[i];
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    const char want = kScheme[i] >= 'A' && kScheme[i] <= 'Z'
                          ? static_cast<char>(kScheme[i] - 'A' + 'a')
                          : kScheme[i];
    if (lower != want) return AuthResult::kMissing;
  }
  value.remove_prefix(kScheme.size());
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  return constant_time_equal(value, token) ? AuthResult::kOk : AuthResult::kWrong;
}

int http_status(AuthResult result) {
  switch (result) {
    case AuthResult::kOk:
      return 200;
    case AuthResult::kMissing:
      return 401;
    case AuthResult::kWrong:
      return 403;
  }
  return 500;
}

}  // namespace weightcast::sync::engine
