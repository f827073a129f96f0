// Helpers for the security tests that drive real processes: a weightcast-engine (or the test's
// store server) started on an ephemeral port, HTTP calls with explicit headers and timeouts, and
// the engine's observable state, so a test can prove a refused request changed nothing.
// Lifetime: an EngineProcess kills its child on destruction (Subprocess). Threading: one owner
// thread per object.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/subprocess.h"

namespace weightcast::security {

using Json = nlohmann::json;

struct HttpReply {
  int status = 0;  // 0: transport error (connection refused, reset, timed out)
  std::string body;
  Json json;  // discarded (is_discarded()) when the body is not JSON
  std::map<std::string, std::string> headers;
  std::string message() const;
};

// What a refused request must leave unchanged: session, pause flag, version, groups, runner
// digests and the counters of /metrics that requests move.
struct EngineState {
  bool in_session = false;
  std::string session_selector;
  bool paused = false;
  std::string weight_version;
  std::vector<std::string> groups;  // "name:aborted:buckets:bytes"
  std::string target_digest;
  std::string draft_digest;
  std::string updates_ok;
  std::string updates_failed;
  std::string cache_flushes;
  bool operator==(const EngineState&) const = default;
};
std::ostream& operator<<(std::ostream& os, const EngineState& s);

class EngineProcess {
 public:
  // weightcast-engine --port 0 --model tiny --seed 3, a target and a draft runner (both with
  // the shuffle layout), short timeouts, then `extra`. Throws std::runtime_error when it does not
  // print its "listening on" line.
  explicit EngineProcess(std::vector<std::string> extra = {}, std::string token = "");

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  pid_t pid() const { return process_.pid(); }
  testing::Subprocess& process() { return process_; }

  // `auth`: the whole Authorization header value ("" sends none). By default the engine's token.
  HttpReply get(const std::string& path) const { return call("GET", path, "", bearer()); }
  HttpReply post(const std::string& path, const std::string& body) const {
    return call("POST", path, body, bearer());
  }
  HttpReply call(const std::string& method, const std::string& path, const std::string& body,
                 const std::string& auth) const;
  std::string bearer() const { return token_.empty() ? "" : "Bearer " + token_; }

  EngineState state() const;

 private:
  testing::Subprocess process_;
  std::string host_;
  int port_ = 0;
  std::string token_;
};

// Starts the test's store server (store_server_main.cc) with `args`; returns its port.
struct StoreProcess {
  explicit StoreProcess(std::vector<std::string> args);
  testing::Subprocess process;
  std::string host;
  int port = 0;
};

// Resident set size of process `pid` in bytes (VmRSS), 0 when unreadable.
std::size_t resident_bytes(pid_t pid);

}  // namespace weightcast::security
