#include "sync/engine/http/auth.h"

#include <cstddef>

namespace weightcast::sync::engine {

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
