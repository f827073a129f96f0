// Where the servers listen, and where the engine may be told to connect. The engine and the store
// listen on the configured address only (loopback by default, never all interfaces), read from
// the sockets the process holds (/proc) and by connecting; with --host 127.0.0.2 the engine is
// unreachable on 127.0.0.1, its data plane included. --allowed-master-addresses refuses any other
// master_address with 403 before dialling anything: a listening socket named in the refused
// request sees no connection, while an allowed address is dialled.
#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "comm/errors.h"
#include "sync/protocol/protocol.h"
#include "tests/security/engine_process.h"
#include "tests/security/inprocess_engine.h"
#include "tests/security/net_probe.h"
#include "tests/sync/engine/process_sender.h"

namespace weightcast::security {
namespace {

using namespace std::chrono_literals;

std::string describe(const std::vector<ListeningSocket>& sockets) {
  std::string out;
  for (const auto& s : sockets) out += s.address + ":" + std::to_string(s.port) + " ";
  return out;
}

void expect_all_on(const std::vector<ListeningSocket>& sockets, const std::string& address) {
  EXPECT_FALSE(sockets.empty());
  for (const auto& s : sockets) {
    EXPECT_EQ(s.address, address) << "listening on " << describe(sockets);
  }
}

TEST(SecurityBinding, EngineListensOnLoopbackByDefault) {
  EngineProcess engine;
  EXPECT_EQ(engine.host(), "127.0.0.1");
  const auto sockets = listening_sockets(engine.pid());
  expect_all_on(sockets, "127.0.0.1");
  EXPECT_EQ(sockets.size(), 1u) << describe(sockets);
  EXPECT_FALSE(can_connect("127.0.0.2", engine.port(), 1s));
}

TEST(SecurityBinding, EngineBoundTo127002IsUnreachableOn127001DataPlaneIncluded) {
  EngineProcess engine({"--host", "127.0.0.2"});
  ASSERT_EQ(engine.host(), "127.0.0.2");
  EXPECT_TRUE(can_connect("127.0.0.2", engine.port(), 2s));
  EXPECT_FALSE(can_connect("127.0.0.1", engine.port(), 1s));
  expect_all_on(listening_sockets(engine.pid()), "127.0.0.2");
  // Joined to a group, the engine's data-plane sockets follow --host too.
  sync::engine::testing::Sender sender({{engine.host(), engine.port(), 1}}, "g", 10s);
  const auto joined = sender.init();
  ASSERT_EQ(joined.at(0).status, 200) << joined.at(0).body.dump();
  const auto sockets = listening_sockets(engine.pid());
  expect_all_on(sockets, "127.0.0.2");
  std::printf("[figure] engine --host 127.0.0.2 with a joined group listens on: %s\n",
              describe(sockets).c_str());
}

TEST(SecurityBinding, StoreListensOnlyOnItsBindAddress) {
  StoreProcess loopback({});
  EXPECT_EQ(loopback.host, "127.0.0.1");
  expect_all_on(listening_sockets(loopback.process.pid()), "127.0.0.1");
  EXPECT_FALSE(can_connect("127.0.0.2", loopback.port, 1s));

  StoreProcess other({"--bind", "127.0.0.2"});
  expect_all_on(listening_sockets(other.process.pid()), "127.0.0.2");
  EXPECT_TRUE(can_connect("127.0.0.2", other.port, 2s));
  EXPECT_FALSE(can_connect("127.0.0.1", other.port, 1s));
}

std::string init_body(const std::string& address, int port) {
  sync::InitWeightsUpdateGroupRequest r;
  r.master_address = address;
  r.master_port = port;
  r.rank_offset = 1;
  r.world_size = 2;
  r.group_name = "g";
  r.backend = sync::Backend::kGloo;
  return sync::to_json_string(r);
}

TEST(SecurityBinding, EngineRefusesMasterAddressesOutsideTheAllowedListBeforeConnecting) {
  EngineProcess engine({"--allowed-master-addresses", "127.0.0.2, trainer-0.example"});
  Listener refused("127.0.0.1");
  const EngineState before = engine.state();
  for (const std::string address : {"127.0.0.1", "localhost", "127.0.0.02", "trainer-0"}) {
    SCOPED_TRACE(address);
    const HttpReply r =
        engine.post("/init_weights_update_group", init_body(address, refused.port()));
    EXPECT_EQ(r.status, 403) << r.body;
    EXPECT_EQ(r.message().rfind("master_address", 0), 0u) << r.message();
    EXPECT_EQ(engine.state(), before);
  }
  EXPECT_FALSE(refused.accepted_within(300ms)) << "the engine dialled a refused master";

  // An allowed address is dialled: the same probe sees the connection (a listener that never
  // answers, so the join then fails within --init-timeout-ms).
  Listener allowed("127.0.0.2");
  auto call = std::async(std::launch::async, [&] {
    return engine.post("/init_weights_update_group", init_body("127.0.0.2", allowed.port()));
  });
  EXPECT_TRUE(allowed.accepted_within(5s)) << "the allowed master was not dialled";
  const HttpReply r = call.get();
  // The failed join, answered in SGLang's dialect (the init names no rendezvous): 400.
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_TRUE(engine.state().groups.empty());
}

TEST(SecurityBinding, AllowedMasterAddressesAreMatchedAsTextBeforeTheConnector) {
  std::atomic<int> dialled{0};
  sync::engine::EngineOptions opts;
  opts.allowed_master_addresses = {"Trainer-0.Example", "10.0.0.7"};
  opts.connector = [&](const sync::engine::GroupSpec&, const sync::engine::ConnectOptions&)
      -> std::vector<std::unique_ptr<sync::engine::BucketChannel>> {
    ++dialled;
    throw comm::TimeoutError("test connector: no trainer");
  };
  auto engine = make_inprocess_engine(opts);
  auto init = [&](const std::string& address) {
    return engine->init_weights_update_group(
        sync::parse_init_weights_update_group(init_body(address, 29500)));
  };
  for (const std::string address : {"10.0.0.8", "10.0.0.7.", "trainer-0", "127.0.0.1"}) {
    EXPECT_EQ(init(address).status, 403) << address;
  }
  EXPECT_EQ(dialled, 0);
  // Dialled, the join times out: 400 in SGLang's dialect (no rendezvous named).
  EXPECT_EQ(init("trainer-0.example").status, 400) << "case-insensitive, then dialled";
  EXPECT_EQ(init("10.0.0.7").status, 400);
  EXPECT_EQ(dialled, 2);

  sync::engine::EngineOptions any;
  any.connector = opts.connector;
  auto open = make_inprocess_engine(any);
  EXPECT_EQ(open->init_weights_update_group(
                    sync::parse_init_weights_update_group(init_body("192.0.2.1", 29500)))
                .status,
            400)
      << "no list: any address is dialled";
  EXPECT_EQ(dialled, 3);
}

}  // namespace
}  // namespace weightcast::security

namespace weightcast::security {
namespace {

// weightcast-engine with `flags`, its stderr folded into stdout; returns what it printed up to
// and including its "listening on" line.
std::string engine_start_output(const std::vector<std::string>& flags) {
  std::string command = std::string("exec '") + WEIGHTCAST_ENGINE_BIN + "' --port 0 --model tiny";
  for (const auto& f : flags) command += " '" + f + "'";
  testing::Subprocess engine({"/bin/sh", "-c", command + " 2>&1"});
  if (!engine.wait_for_line("weightcast-engine listening on ", 20s)) {
    ADD_FAILURE() << "engine did not start: " << engine.output();
  }
  return engine.output();
}

TEST(SecurityBinding, EngineWarnsAtStartWhenReachableBeyondLoopbackWithoutAToken) {
  const std::string warning = "WARNING: listening on 0.0.0.0 without --token";
  EXPECT_NE(engine_start_output({"--host", "0.0.0.0"}).find(warning), std::string::npos);
  EXPECT_EQ(engine_start_output({"--host", "0.0.0.0", "--token", "t0ken"}).find("WARNING"),
            std::string::npos);
  EXPECT_EQ(engine_start_output({"--host", "127.0.0.2"}).find("WARNING"), std::string::npos);
}

}  // namespace
}  // namespace weightcast::security
