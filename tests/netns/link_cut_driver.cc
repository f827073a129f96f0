// The trainer side of the link-cut test: one process holding a DistributedUpdater, run inside the
// trainer's network namespace, doing three updates of the "tiny" model's target tensors, with
// SIGUSR1 from the test as the "go" between steps:
//
//   update 1 (step 1)                      -> "update 1 <summary>", "verify 1 ok"
//   "waiting before update 2"              <- SIGUSR1
//   update 2 (step 2): at the start of broadcast --cut-before-bucket, "cut-point bucket K"
//                                          <- SIGUSR1 (the test has cut a link meanwhile)
//                                          -> "update 2 <summary>", "data_seconds <s>",
//                                             "failure engine=... timed_out=0|1 ..." per failure
//   "waiting before update 3"              <- SIGUSR1 (the link is back)
//   update 3 (step 3, a new group)         -> "update 3 <summary>", "verify 3 ok"
//
// Holding before a broadcast (rather than cutting at some moment) makes the cut land between
// buckets: every byte of bucket K-1 went through and was answered, none of bucket K did.
// Verification compares every runner of every engine with digests computed here from the
// generator (sync/trainer/verify.h). Exit code: 0 when the three steps ran (the test judges the
// outcomes from the lines), 2 bad arguments, 3 a go signal never came.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/model.h"
#include "sync/trainer/updater.h"
#include "sync/trainer/verify.h"

namespace {

namespace ws = weightcast::sync;
namespace wt = weightcast::sync::trainer;
namespace wc = weightcast::comm;

// Waits for SIGUSR1 (blocked in every thread since the start of main).
bool wait_go(int timeout_ms) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  const timespec limit{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  return sigtimedwait(&set, nullptr, &limit) == SIGUSR1;
}

struct Hold {
  std::atomic<bool> armed{false};
  std::atomic<int> broadcasts{0};
  int before_bucket = 2;
  int timeout_ms = 30000;
};

// Forwards to the real communicator; while armed, holds the source at the start of broadcast
// `before_bucket` until the test says go.
class HoldingCommunicator final : public wc::Communicator {
 public:
  HoldingCommunicator(std::unique_ptr<wc::Communicator> inner, std::shared_ptr<Hold> hold)
      : inner_(std::move(inner)), hold_(std::move(hold)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  std::string_view data_path() const override { return inner_->data_path(); }
  wc::Millis default_timeout() const override { return inner_->default_timeout(); }
  void broadcast(const wc::BroadcastOptions& opts) override {
    if (hold_->armed && hold_->broadcasts++ == hold_->before_bucket) {
      std::printf("cut-point bucket %d\n", hold_->before_bucket);
      std::fflush(stdout);
      if (!wait_go(hold_->timeout_ms)) throw wc::TimeoutError("no go signal at the cut point");
    }
    inner_->broadcast(opts);
  }
  void barrier(wc::Millis timeout) override { inner_->barrier(timeout); }
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }

 private:
  std::unique_ptr<wc::Communicator> inner_;
  std::shared_ptr<Hold> hold_;
};

std::vector<wt::HostTensor> weights(const ws::ModelSpec& spec, std::uint64_t seed,
                                    std::uint64_t step) {
  std::vector<wt::HostTensor> out;
  for (const auto& meta : ws::target_tensors(spec)) {
    auto& t = out.emplace_back(wt::HostTensor{meta, {}});
    t.bytes.resize(meta.byte_count());
    ws::fill_tensor(meta, seed, step, t.bytes);
  }
  return out;
}

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// The driver's flags.
struct DriverArgs {
  std::string engines_text, bind = "127.0.0.1", model = "tiny";
  std::uint64_t seed = 0;
  std::size_t bucket_bytes = 256 << 10;
  int bucket_delay_ms = 100, data_timeout_ms = 5000, group_timeout_ms = 5000;
  int request_timeout_ms = 2000, connect_timeout_ms = 1000, grace_ms = 500, go_timeout_ms = 30000;

  void add_to(CLI::App& app, Hold& hold) {
    app.add_option("--engines", engines_text, "engine URLs, comma separated")->required();
    app.add_option("--bind", bind, "address of the store and the data plane");
    app.add_option("--model", model, "model preset (the engines' --model)");
    app.add_option("--seed", seed, "generator seed (the engines' --seed)");
    app.add_option("--bucket-bytes", bucket_bytes, "largest bucket");
    app.add_option("--bucket-delay-ms", bucket_delay_ms, "sleep after each bucket");
    app.add_option("--data-timeout-ms", data_timeout_ms, "data phase deadline");
    app.add_option("--group-timeout-ms", group_timeout_ms, "group setup and collectives");
    app.add_option("--request-timeout-ms", request_timeout_ms, "control routes");
    app.add_option("--connect-timeout-ms", connect_timeout_ms, "TCP connect to an engine");
    app.add_option("--failure-grace-ms", grace_ms, "wait for other answers after a failure");
    app.add_option("--cut-before-bucket", hold.before_bucket,
                   "hold before this bucket of update 2");
    app.add_option("--go-timeout-ms", go_timeout_ms, "longest wait for each go signal");
  }

  // The updater's options; its communicators hold before the cut bucket while `hold` is armed.
  wt::UpdaterOptions updater_options(const std::shared_ptr<Hold>& hold) const {
    wt::UpdaterOptions options;
    options.selector_config = {"EAGLE", 0, "raw"};  // -> "target": the draft stays frozen
    options.bind_address = bind;
    options.buckets.bucket_bytes = bucket_bytes;
    options.buckets.bucket_delay = wc::Millis(bucket_delay_ms);
    options.buckets.timeout = wc::Millis(data_timeout_ms);
    options.buckets.failure_grace = wc::Millis(grace_ms);
    options.group_timeout = wc::Millis(group_timeout_ms);
    options.request_timeout = wc::Millis(request_timeout_ms);
    options.connect_timeout = wc::Millis(connect_timeout_ms);
    options.communicator_factory = [hold](std::string_view backend, const wc::CommOptions& o) {
      return std::unique_ptr<wc::Communicator>(
          new HoldingCommunicator(wc::create_communicator(backend, o), hold));
    };
    return options;
  }

  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (std::size_t start = 0; start <= engines_text.size();) {
      const std::size_t end = engines_text.find(',', start);
      out.push_back(engines_text.substr(start, end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
    return out;
  }
};

// One committed-or-not update of step `step`, its report printed line by line; a committed one
// is verified.
void run_update(int step, const ws::ModelSpec& spec, std::uint64_t seed,
                wt::DistributedUpdater& updater, wt::UpdateVerifier& verifier) {
  const auto tensors = weights(spec, seed, static_cast<std::uint64_t>(step));
  const auto views = wt::views(tensors);
  const wt::UpdateReport report = updater.update(views);
  say("update " + std::to_string(step) + " " + wt::summary(report));
  say("data_seconds " + std::to_string(report.phases.data) + " failed_engine " +
      (report.failed_engine.empty() ? "-" : report.failed_engine));
  for (const auto& f : report.failures) {
    say("failure engine=" + f.engine + " route=" + f.route +
        " timed_out=" + (f.timed_out ? "1" : "0") + " unreachable=" + (f.unreachable ? "1" : "0") +
        " message=" + f.message);
  }
  if (!report.ok) return;
  verifier.apply(updater.selector(), wt::sent_digests(views));
  const auto problems = verifier.check(report.version);
  say("verify " + std::to_string(step) + " " +
      (problems.empty() ? std::string("ok")
                        : "FAILED " + std::to_string(problems.size()) +
                              " problem(s); first: " + problems.front().text));
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the mask and sigtimedwait gets the signal.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);

  DriverArgs args;
  auto hold = std::make_shared<Hold>();
  CLI::App app("link-cut test driver: three updates, SIGUSR1 between steps");
  args.add_to(app, *hold);
  CLI11_PARSE(app, argc, argv);
  hold->timeout_ms = args.go_timeout_ms;

  const ws::ModelSpec spec = ws::model_preset(args.model);
  wt::DistributedUpdater updater(args.urls(), args.updater_options(hold));
  wt::UpdateVerifier verifier(updater.engines(), updater.connect(), spec, args.seed);

  run_update(1, spec, args.seed, updater, verifier);
  say("waiting before update 2");
  if (!wait_go(args.go_timeout_ms)) return 3;
  hold->broadcasts = 0;
  hold->armed = true;
  run_update(2, spec, args.seed, updater, verifier);
  hold->armed = false;
  say("waiting before update 3");
  if (!wait_go(args.go_timeout_ms)) return 3;
  run_update(3, spec, args.seed, updater, verifier);
  return 0;
}
