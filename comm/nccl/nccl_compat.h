// NCCL version handling, in one place. Everything else in comm/nccl/ includes this header instead
// of nccl.h and writes no version #if of its own. Private to comm/nccl/ (never installed).
//
// The backend relies on three features that appeared together in NCCL 2.14: communicators created
// from an ncclConfig_t (ncclCommInitRankConfig), the non-blocking mode of that config (so every
// wait can be bounded by polling ncclCommGetAsyncError), and ncclCommFinalize (so a healthy
// communicator is torn down without blocking). Older headers stop the build here; an older
// library loaded at run time is refused by check_runtime_version() with a ConfigError.
#pragma once

#include <nccl.h>

#include <string>

#include "comm/errors.h"

#if !defined(NCCL_VERSION_CODE) || !defined(NCCL_VERSION)
#error "weightcast's NCCL backend needs NCCL >= 2.14.0 (this nccl.h defines no NCCL_VERSION_CODE)"
#endif

#define WEIGHTCAST_NCCL_MIN_VERSION NCCL_VERSION(2, 14, 0)

#if NCCL_VERSION_CODE < WEIGHTCAST_NCCL_MIN_VERSION
// 2.14 added ncclCommInitRankConfig, the non-blocking config and ncclCommFinalize.
#error "weightcast's NCCL backend needs NCCL >= 2.14.0"
#endif

namespace weightcast::comm::nccl_compat {

inline constexpr int kMinVersion = WEIGHTCAST_NCCL_MIN_VERSION;

// A config whose init and collectives return ncclInProgress instead of blocking the caller.
inline ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// NCCL's own detail for the last failure ("" when it has none). Shared across communicators,
// so callers add it as context, never as the primary message.
inline std::string last_error(ncclComm_t comm) {
  const char* text = ncclGetLastError(comm);
  return text != nullptr ? std::string(text) : std::string();
}

// "<ncclGetErrorString> (<ncclGetLastError>)" for messages.
inline std::string describe(ncclResult_t result, ncclComm_t comm) {
  std::string out = ncclGetErrorString(result);
  const std::string extra = last_error(comm);
  if (!extra.empty()) out += " (" + extra + ")";
  return out;
}

// Refuses a libnccl older than kMinVersion: the header may be newer than the library the loader
// picked, and an old library would misread the config struct.
inline void check_runtime_version() {
  int version = 0;
  const ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    throw ConfigError(std::string("ncclGetVersion failed: ") + ncclGetErrorString(result));
  }
  if (version < kMinVersion) {
    throw ConfigError(detail::concat("the loaded libnccl is version code ", version,
                                     ", weightcast needs at least ", kMinVersion, " (NCCL 2.14)"));
  }
}

}  // namespace weightcast::comm::nccl_compat
