// Secrets the engine hands out and checks: session and lease ids.
//
// Ids are drawn from the operating system's CSPRNG (getrandom(2)), never from a seeded PRNG,
// and are compared in time that depends only on the lengths, so neither guessing nor timing
// the engine's answers reveals one. The bearer-token check (sync/engine/http/auth.h) uses the
// same comparison.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weightcast::sync::engine {

// `bytes` random bytes from getrandom(2), as 2 * bytes lowercase hex digits. Throws
// comm::ConfigError when the kernel cannot supply them (it blocks only before the pool is
// initialised at boot).
std::string random_hex(std::size_t bytes);

// Equality in time that depends only on the lengths, never on the contents.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace weightcast::sync::engine
