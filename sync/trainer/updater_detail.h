// A helper shared by the files of DistributedUpdater (updater.cc, updater_session.cc).
// Lifetime/threading: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace weightcast::sync::trainer::detail {

// An engine's weight_version as a number, when it is one ("3"); anything else counts as 0.
std::uint64_t numeric_version(const std::string& text);

}  // namespace weightcast::sync::trainer::detail
