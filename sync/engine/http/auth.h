// Bearer-token checks for the engine's HTTP routes.
//
// With a token configured, every route whose auth level is kToken needs the header
// "Authorization: Bearer <token>": no header (or another scheme) is 401, a wrong token is 403.
// The comparison takes time independent of where the strings differ, so response timing does not
// leak a prefix of the token.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string_view>

#include "sync/engine/control/secret.h"  // constant_time_equal

namespace weightcast::sync::engine {

enum class AuthResult { kOk, kMissing, kWrong };

// `header`: the Authorization header's value, nullopt when absent. An empty `token` means no
// authentication is configured and everything is kOk.
AuthResult check_bearer(std::optional<std::string_view> header, std::string_view token);

// 200 for kOk, 401 for kMissing, 403 for kWrong.
int http_status(AuthResult result);

}  // namespace weightcast::sync::engine
