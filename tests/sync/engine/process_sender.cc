#include "tests/sync/engine/process_sender.h"

#include <chrono>
#include <future>

#include "comm/errors.h"
#include "comm/store/prefix_store.h"
#include "sync/model/bucket.h"
#include "sync/protocol/protocol.h"
#include "tests/support/engine_launch.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine::testing {

Sender::Sender(std::vector<EngineEndpoint> engines, std::string group, comm::Millis timeout)
    : engines_(std::move(engines)), group_(std::move(group)), timeout_(timeout) {}

Sender::~Sender() {
  if (comm_) comm_->abort();
  comm_.reset();
  store_.reset();
}

int Sender::rank_offset(std::size_t engine) const {
  int offset = 1;
  for (std::size_t j = 0; j < engine; ++j) offset += engines_[j].ranks;
  return offset;
}

int Sender::world_size() const {
  return rank_offset(engines_.size());
}

weightcast::testing::EngineHttp Sender::client(std::size_t engine) const {
  // Reads outlast the group timeout: a bucket request answers only once its broadcast ended.
  return weightcast::testing::EngineHttp(
      engines_[engine].host, engines_[engine].port,
      {std::chrono::seconds(5), timeout_ + std::chrono::seconds(10), std::chrono::seconds(10)});
}

HttpResult Sender::get(std::size_t engine, const std::string& path) {
  return client(engine).get(path);
}

HttpResult Sender::post(std::size_t engine, const std::string& path, const std::string& body) {
  return client(engine).post(path, body);
}

std::vector<HttpResult> Sender::init() {
  if (comm_) comm_->abort();
  comm_.reset();
  // A fresh store server per init, so no key of a failed group can be read again.
  store_ = std::make_unique<comm::TcpStoreServer>(comm::TcpStoreServerOptions{});
  std::vector<std::future<HttpResult>> calls;
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    InitWeightsUpdateGroupRequest r;
    r.master_address = store_->host();
    r.master_port = store_->port();
    r.rank_offset = rank_offset(i);
    r.world_size = world_size();
    r.group_name = group_;
    r.backend = Backend::kGloo;
    calls.push_back(std::async(std::launch::async, [this, i, body = to_json_string(r)] {
      return post(i, "/init_weights_update_group", body);
    }));
  }
  comm::TcpStoreOptions sopts;
  sopts.host = store_->host();
  sopts.port = store_->port();
  sopts.connect_timeout = timeout_;
  comm::CommOptions copts = comm::member_options(
      std::make_shared<comm::PrefixStore>(group_, std::make_shared<comm::TcpStore>(sopts)), 0,
      world_size(), timeout_);
  copts.gloo.chain.chunk_bytes = 64 << 10;
  try {
    comm_ = comm::create_communicator("gloo", copts);
  } catch (const comm::Error&) {
    comm_.reset();  // the engines' answers say why
  }
  std::vector<HttpResult> out;
  for (auto& c : calls) out.push_back(c.get());
  return out;
}

std::vector<HttpResult> Sender::update(Selector selector, const std::vector<RawTensor>& tensors,
                                       std::size_t bucket_bytes, const std::string& version,
                                       std::optional<std::size_t> stop_after) {
  WC_ENFORCE(comm_ != nullptr, "init() first");
  std::vector<HttpResult> out;
  BeginWeightUpdateRequest begin{selector};
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    auto r = post(i, "/begin_weight_update", to_json_string(begin));
    if (r.status != 200) return {r};
  }
  const auto plans = plan_buckets(metas_of(tensors), bucket_bytes);
  for (const auto& plan : plans) {
    std::vector<RawTensor> members;
    for (const auto& e : plan.entries) {
      for (const auto& t : tensors) {
        if (t.meta.name == e.meta.name) members.push_back(t);
      }
    }
    const PackedBucket packed = pack_bucket(plan.sequence, members);
    WC_ENFORCE(packed.plan == plan, "the engine recomputes the same plan");
    UpdateWeightsFromDistributedRequest req;
    req.tensors = metas_of(members);
    req.group_name = group_;
    req.selector = selector;
    req.sequence = plan.sequence;
    const std::string body = to_json_string(req);
    // The request answers once the bucket is received, so it goes first, asynchronously.
    std::vector<std::future<HttpResult>> calls;
    for (std::size_t i = 0; i < engines_.size(); ++i) {
      calls.push_back(std::async(std::launch::async, [this, i, body] {
        return post(i, "/update_weights_from_distributed", body);
      }));
    }
    const bool stop = stop_after && plan.sequence == *stop_after;
    if (!stop) {
      std::vector<std::byte> buffer = packed.bytes;
      comm::BroadcastOptions b;
      b.buffer = buffer.data();
      b.bytes = buffer.size();
      b.root = 0;
      comm_->broadcast(b);
    }
    std::vector<HttpResult> answers;
    for (auto& c : calls) answers.push_back(c.get());
    if (stop) return answers;
    for (const auto& a : answers) {
      if (a.status != 200) return answers;
    }
  }
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    auto r = post(i, "/update_weight_version", to_json_string(UpdateWeightVersionRequest{version}));
    if (r.status != 200) return {r};
  }
  for (std::size_t i = 0; i < engines_.size(); ++i)
    out.push_back(post(i, "/end_weight_update", ""));
  return out;
}

std::map<std::string, std::string> expected_digests(const std::vector<RawTensor>& tensors,
                                                    Layout layout) {
  std::map<std::string, std::string> out;
  for (const auto& t : tensors) out[t.meta.name] = to_string(tensor_digest(laid_out(t, layout)));
  return out;
}

EngineProcess start_engine_process(const std::string& binary, int ranks, std::uint64_t seed,
                                   const std::vector<std::string>& flags) {
  EngineProcess e{weightcast::testing::Subprocess(
                      weightcast::testing::test_engine_argv(binary, ranks, seed, flags)),
                  {}};
  const std::string url =
      weightcast::testing::wait_for_engine_url(e.process, std::chrono::seconds(20));
  const std::string host = url.substr(std::string("http://").size());
  e.endpoint = {host.substr(0, host.rfind(':')), weightcast::testing::url_port(url), ranks};
  return e;
}

}  // namespace weightcast::sync::engine::testing
