// One weightcast member of a group that torch.distributed processes join too (the mixed-group
// interop tests start it beside torch_group_member.py).
//
//   torch_group_member --rank R --world N --group G --spec "int8:1,float32:1024,..."
//                      (--host-store | --store-port P) [--protocol torch1|torch2]
//                      [--chain] [--root K] [--timeout-ms T]
//
// With --host-store it hosts the c10d-compatible store (it must then be rank 0) and prints
// "port <p>"; otherwise it joins the store at 127.0.0.1:P as a torch worker. It forms the group
// (torch-compatible Gloo, or with --chain our pipelined chain for the same-run comparison) and runs
// one broadcast per spec entry from --root. The root fills each buffer with random bytes; every
// member prints "digest <i> <xxh3-128 hex> <bytes> <seconds>" for what it holds afterwards, then
// "done". A failure prints "error <TimeoutError|PeerError|Error> <message>" and exits 3.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_server.h"
#include "comm/store/prefix_store.h"
#include "comm/torch_group.h"
#include "sync/model/checksum.h"

namespace {

using namespace weightcast;

struct Args {
  int rank = -1;
  int world = 0;
  int root = 0;
  std::string group = "weight_update_group";
  std::string spec;
  bool host_store = false;
  int store_port = 0;
  bool chain = false;
  comm::C10dProtocol protocol = comm::C10dProtocol::kTorch1;
  comm::Millis timeout{30000};
};

struct Entry {
  std::string dtype;
  std::size_t bytes = 0;
};

std::size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "int8" || dtype == "uint8") return 1;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float64" || dtype == "int64") return 8;
  throw std::invalid_argument("unknown dtype '" + dtype + "'");
}

std::vector<Entry> parse_spec(const std::string& spec) {
  std::vector<Entry> out;
  std::size_t pos = 0;
  while (pos < spec.size()) {
    const std::size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) throw std::invalid_argument("bad spec item '" + item + "'");
    const std::string dtype = item.substr(0, colon);
    out.push_back({dtype, dtype_bytes(dtype) * std::stoull(item.substr(colon + 1))});
    pos = comma + 1;
  }
  return out;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--rank")
      a.rank = std::stoi(value());
    else if (flag == "--world")
      a.world = std::stoi(value());
    else if (flag == "--root")
      a.root = std::stoi(value());
    else if (flag == "--group")
      a.group = value();
    else if (flag == "--spec")
      a.spec = value();
    else if (flag == "--host-store")
      a.host_store = true;
    else if (flag == "--store-port")
      a.store_port = std::stoi(value());
    else if (flag == "--chain")
      a.chain = true;
    else if (flag == "--timeout-ms")
      a.timeout = comm::Millis(std::stoll(value()));
    else if (flag == "--protocol") {
      const std::string p = value();
      if (p != "torch1" && p != "torch2") throw std::invalid_argument("--protocol torch1|torch2");
      a.protocol = p == "torch1" ? comm::C10dProtocol::kTorch1 : comm::C10dProtocol::kTorch2;
    } else {
      throw std::invalid_argument("unknown argument '" + flag + "'");
    }
  }
  if (a.rank < 0 || a.world <= a.rank) throw std::invalid_argument("need 0 <= --rank < --world");
  if (a.host_store == (a.store_port != 0)) {
    throw std::invalid_argument("give exactly one of --host-store and --store-port");
  }
  return a;
}

std::shared_ptr<comm::Store> group_store(const Args& a,
                                         std::unique_ptr<comm::C10dStoreServer>& server) {
  comm::C10dStoreOptions opts;
  opts.protocol = a.protocol;
  opts.connect_timeout = a.timeout;
  if (a.host_store) {
    server = std::make_unique<comm::C10dStoreServer>(comm::C10dStoreServerOptions{});
    std::cout << "port " << server->port() << std::endl;
    opts.port = server->port();
  } else {
    opts.port = static_cast<std::uint16_t>(a.store_port);
  }
  auto store = std::make_shared<comm::C10dStore>(opts);
  store->join_as_worker(a.timeout);
  const auto keys = a.protocol == comm::C10dProtocol::kTorch1 ? comm::TorchKeys::kTorch1
                                                              : comm::TorchKeys::kTorch2;
  if (a.chain) return std::make_shared<comm::PrefixStore>(a.group, store);
  return comm::torch_group_store(store, a.group, "gloo", keys);
}

int run(const Args& a) {
  const std::vector<Entry> entries = parse_spec(a.spec);
  std::unique_ptr<comm::C10dStoreServer> server;
  comm::CommOptions opts = comm::member_options(group_store(a, server), a.rank, a.world, a.timeout);
  opts.torch_compatible = !a.chain;
  auto comm = comm::create_communicator("gloo", opts);
  std::cout << "joined" << std::endl;
  std::mt19937_64 rng(0x5eed0000u + static_cast<unsigned>(a.rank));
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::vector<std::uint8_t> buf(entries[i].bytes);
    if (a.rank == a.root) {
      for (std::size_t j = 0; j < buf.size(); j += 8) {
        const std::uint64_t word = rng();
        std::memcpy(buf.data() + j, &word, std::min<std::size_t>(8, buf.size() - j));
      }
    }
    const auto start = std::chrono::steady_clock::now();
    comm->broadcast({buf.data(), buf.size(), a.root, comm::MemoryKind::kHost, a.timeout, {}});
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    const auto digest = sync::tensor_digest(std::as_bytes(std::span(buf)));
    std::cout << "digest " << i << " " << sync::to_string(digest) << " " << buf.size() << " "
              << took.count() << std::endl;
  }
  std::cout << "done" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const comm::TimeoutError& e) {
    std::cout << "error TimeoutError " << e.what() << std::endl;
  } catch (const comm::PeerError& e) {
    std::cout << "error PeerError " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cout << "error Error " << e.what() << std::endl;
  }
  return 3;
}
