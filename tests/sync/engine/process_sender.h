// A minimal weight sender for the multi-process engine tests: it plays a trainer's PP-stage
// source (group rank 0). It hosts a TcpStoreServer on an ephemeral port, joins the engines'
// group through it with a Gloo communicator while the engines' init requests are in flight,
// and sends updates the way docs/protocol.md describes: begin, per bucket an asynchronous
// update_weights_from_distributed request plus one broadcast, update_weight_version, end.
// Every HTTP call has connect/read/write timeouts; every collective has the group timeout.
// Threading: one owner thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/store/tcp_store.h"
#include "sync/engine/runners/runner.h"
#include "sync/protocol/selector.h"
#include "tests/support/engine_http.h"
#include "tests/support/subprocess.h"

namespace weightcast::sync::engine::testing {

struct EngineEndpoint {
  std::string host;
  int port = 0;
  int ranks = 1;
};

using HttpResult = weightcast::testing::HttpAnswer;  // status 0: transport error

class Sender {
 public:
  Sender(std::vector<EngineEndpoint> engines, std::string group, comm::Millis timeout);
  ~Sender();

  // A new store server and communicator; every engine gets its rank_offset. Returns each
  // engine's init result (all 200 when the group formed).
  std::vector<HttpResult> init();

  // One update of `tensors` in buckets of at most `bucket_bytes`. With `stop_after`, the sender
  // sends the requests of bucket `stop_after` but never broadcasts it (a sender that died), and
  // returns the engines' answers to that bucket. Otherwise returns the end results.
  std::vector<HttpResult> update(Selector selector, const std::vector<RawTensor>& tensors,
                                 std::size_t bucket_bytes, const std::string& version,
                                 std::optional<std::size_t> stop_after = std::nullopt);

  HttpResult get(std::size_t engine, const std::string& path);
  HttpResult post(std::size_t engine, const std::string& path, const std::string& body);

  int rank_offset(std::size_t engine) const;
  int world_size() const;

 private:
  weightcast::testing::EngineHttp client(std::size_t engine) const;

  std::vector<EngineEndpoint> engines_;
  std::string group_;
  comm::Millis timeout_;
  std::unique_ptr<comm::TcpStoreServer> store_;
  std::unique_ptr<comm::Communicator> comm_;
};

// Per-tensor digests a runner with `layout` must report for `tensors`, by name (hex).
std::map<std::string, std::string> expected_digests(const std::vector<RawTensor>& tensors,
                                                    Layout layout);

// weightcast-engine (`binary`) as a child process with `ranks` ranks, initial weights of `seed`,
// a target (shuffle) and a frozen draft (shuffle, a filter that matches none of the sent names),
// and `flags`; its endpoint read from its "listening on" line (within 20 s).
struct EngineProcess {
  weightcast::testing::Subprocess process;
  EngineEndpoint endpoint;
};
EngineProcess start_engine_process(const std::string& binary, int ranks, std::uint64_t seed,
                                   const std::vector<std::string>& flags);

}  // namespace weightcast::sync::engine::testing
