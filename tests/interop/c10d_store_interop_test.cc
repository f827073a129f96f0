// weightcast's torch-compatible store against the real torch (Debian's python3-torch 1.13), in
// both directions: torch hosts TCPStore and C10dStore clients join it; C10dStoreServer hosts and
// torch joins with TCPStore(is_master=False) and with torch.distributed.rendezvous("tcp://...").
// Each side sets what the other gets, both add to one counter, and each blocks in a wait until the
// other sets (c10d_store_peer.py is the torch side). Garbage from a raw socket meanwhile drops
// only that connection. Skips, with the reason, where no interpreter imports torch.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "comm/errors.h"
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_server.h"
#include "comm/transport/socket_io.h"
#include "tests/support/subprocess.h"

namespace weightcast::comm {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

constexpr auto kLine = 60s;  // torch's import alone takes seconds on a loaded machine

std::string torch_python() {
  return WEIGHTCAST_TORCH_PYTHON;
}
std::string peer_script() {
  return std::string(WEIGHTCAST_INTEROP_DIR) + "/c10d_store_peer.py";
}

std::string hex(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string line(Subprocess& torch, const std::string& prefix) {
  auto rest = torch.wait_for_line(prefix, kLine);
  if (!rest) {
    ADD_FAILURE() << "torch never printed '" << prefix << "'; its output:\n" << torch.output();
    return "<missing>";
  }
  return *rest;
}

// The weightcast half of c10d_store_peer.py's dialogue, over `store` (keys under prefix `p`).
void dialogue(C10dStore& store, Subprocess& torch, const std::string& p) {
  EXPECT_EQ(store.get(p + "from_torch", kLine), std::string("torch-bytes\0\xff", 13));
  store.set(p + "from_wc", std::string("wc-bytes\x01", 9), 5s);
  EXPECT_EQ(line(torch, "FROM_WC "), hex(std::string("wc-bytes\x01", 9)));
  for (int i = 0; i < 20; ++i) store.add(p + "ctr", 1, 5s);  // interleaved with torch's adds
  store.set(p + "wc_added", "1", 5s);
  store.wait({p + "torch_added"}, kLine);
  EXPECT_EQ(store.get(p + "ctr", 5s), "40");
  EXPECT_EQ(line(torch, "CTR "), "40");
  // torch blocks in wait() until we set; we block in get() until torch sets.
  line(torch, "WAITING");
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(torch.running());
  EXPECT_FALSE(store.check(p + "torch_late", 5s));
  store.set(p + "wc_late", "now", 5s);
  line(torch, "WAITED");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(store.get(p + "torch_late", kLine), "late");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);  // it did block on torch's set
  EXPECT_EQ(line(torch, "CAS "), "first");
  EXPECT_EQ(store.compare_set(p + "cas", "first", "second", 5s), "second");
  store.set(p + "wc_finished", "1", 5s);
  line(torch, "DONE");
  EXPECT_EQ(torch.wait(kLine), 0) << torch.output();
}

class C10dStoreInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (torch_python().empty()) {
      GTEST_SKIP() << "no Python interpreter that imports torch was found at configure time "
                      "(install Debian's python3-torch; WEIGHTCAST_TORCH_PYTHON)";
    }
  }
  Subprocess torch(std::vector<std::string> args) {
    std::vector<std::string> argv = {torch_python(), "-u", peer_script()};
    argv.insert(argv.end(), args.begin(), args.end());
    return Subprocess(argv);
  }
};

// Issue 9, test 1: torch hosts; weightcast clients of both kinds join.
TEST_F(C10dStoreInterop, TorchHostsWeightcastJoins) {
  for (auto protocol : {C10dProtocol::kTorch1, C10dProtocol::kAuto}) {
    const std::string p = std::string(to_string(protocol)) + "/";
    Subprocess host = torch({"host", p});
    const std::string port = line(host, "PORT ");
    ASSERT_NE(port, "<missing>");
    C10dStoreOptions o;
    o.port = static_cast<std::uint16_t>(std::stoi(port));
    o.protocol = protocol;
    o.connect_timeout = 30s;
    C10dStore store(o);
    EXPECT_EQ(store.protocol(), C10dProtocol::kTorch1);  // Debian's torch is 1.13
    EXPECT_EQ(store.join_as_worker(5s), 1);              // torch's "init/" counter, no slash
    dialogue(store, host, p);
  }
}

// A raw socket sends garbage; the server must drop it and go on serving torch.
void expect_garbage_dropped(C10dStoreServer& server) {
  std::string error;
  bool timed_out = false;
  net::Fd raw =
      net::connect_once("127.0.0.1", server.port(), deadline_after(5s), &error, &timed_out);
  ASSERT_TRUE(raw.valid()) << error;
  const std::uint64_t before = server.stats().rejected_frames;
  ASSERT_TRUE(net::send_all(raw.get(), std::string("\x02\xff\xff\xff\xff\xff\xff\xff\x7f", 9),
                            deadline_after(5s))
                  .ok());  // a torch 1.x GET claiming a 2^63-byte key
  char b = 0;
  const auto r = net::recv_exact(raw.get(), &b, 1, deadline_after(5s));
  EXPECT_TRUE(r.io == net::Io::kClosed || r.io == net::Io::kError) << r.describe();
  EXPECT_EQ(server.stats().rejected_frames, before + 1);
}

// Issue 9, tests 2 and 4 (garbage): weightcast hosts; torch joins as a TCPStore worker or through
// rendezvous, and wait_for_workers sees it.
void weightcast_hosts(Subprocess (*start)(const std::string& mode, const std::string& port),
                      const std::string& mode) {
  C10dStoreServer server({});
  C10dStoreOptions o;
  o.port = server.port();
  o.protocol = C10dProtocol::kTorch1;
  C10dStore store(o);
  EXPECT_EQ(store.join_as_worker(5s), 1);  // we are rank 0, as torch's master would be
  Subprocess worker = start(mode, std::to_string(server.port()));
  server.wait_for_workers(2, kLine);
  line(worker, "JOINED");
  EXPECT_GE(server.stats().torch1_connections, 2u);
  expect_garbage_dropped(server);
  dialogue(store, worker, mode + "/");
  const auto keys = server.keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "init/"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "/" + mode + "/from_torch"), keys.end());
}

Subprocess start_peer(const std::string& mode, const std::string& port) {
  return Subprocess({torch_python(), "-u", peer_script(), mode, mode + "/", port});
}

TEST_F(C10dStoreInterop, WeightcastHostsTorchWorkerJoins) {
  weightcast_hosts(start_peer, "worker");
}

TEST_F(C10dStoreInterop, WeightcastHostsTorchRendezvousJoins) {
  weightcast_hosts(start_peer, "rendezvous");
}

}  // namespace
}  // namespace weightcast::comm
