// ConnectionServer: the acceptor loop, the reaper and stop() (connection_server.h). Connections
// live in a list of records, each owning its fd and its thread; a thread marks its record done
// when it returns, and the acceptor joins and drops done records before each wait.
#include "comm/store/connection_server.h"

#include <sys/socket.h>

#include <list>
#include <mutex>
#include <system_error>
#include <thread>

#include "comm/errors.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace {

constexpr Millis kAcceptSlice{500};   // the acceptor reaps at least this often
constexpr Millis kAcceptBackoff{20};  // after an accept() error other than "nothing pending"

}  // namespace

struct ConnectionServer::Impl {
  struct Conn {
    net::Fd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  ConnectionServerOptions opts;
  net::Fd listener;
  std::uint16_t port = 0;
  Serve serve;
  Refuse refuse;
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  std::mutex stop_mu;
  bool stopped = false;

  std::mutex conns_mu;
  std::list<std::unique_ptr<Conn>> conns;

  std::atomic<std::uint64_t> accepted{0}, refused{0}, active{0};

  void accept_loop();
  void start_conn(net::Fd fd);
  void reap_finished();
};

ConnectionServer::ConnectionServer(ConnectionServerOptions opts) : impl_(std::make_unique<Impl>()) {
  if (opts.max_connections == 0) {
    throw ConfigError(detail::concat(opts.name, " max_connections must be positive"));
  }
  auto& s = *impl_;
  s.opts = std::move(opts);
  std::string error;
  s.listener = net::listen_on(s.opts.bind_address, s.opts.port, &s.port, &error);
  if (!s.listener) {
    throw ConfigError(detail::concat(s.opts.name, " cannot listen on ",
                                     net::endpoint(s.opts.bind_address, s.opts.port), ": ", error));
  }
}

ConnectionServer::~ConnectionServer() {
  stop();
}

void ConnectionServer::start(Serve serve, Refuse refuse) {
  auto& s = *impl_;
  WC_ENFORCE(!s.acceptor.joinable() && !s.stopped, "ConnectionServer::start called twice");
  s.serve = std::move(serve);
  s.refuse = std::move(refuse);
  s.acceptor = std::thread([&s] { s.accept_loop(); });
}

std::uint16_t ConnectionServer::port() const {
  return impl_->port;
}
const std::string& ConnectionServer::host() const {
  return impl_->opts.bind_address;
}
ConnectionCounts ConnectionServer::counts() const {
  return {impl_->accepted.load(), impl_->refused.load(), impl_->active.load()};
}
const std::atomic<bool>& ConnectionServer::stopping() const {
  return impl_->stopping;
}

void ConnectionServer::stop(const std::function<void()>& wake) {
  auto& s = *impl_;
  std::lock_guard stop_lock(s.stop_mu);
  if (s.stopped) return;
  s.stopped = true;
  s.stopping = true;
  if (wake) wake();
  if (s.acceptor.joinable()) s.acceptor.join();
  s.listener.reset();
  std::list<std::unique_ptr<Impl::Conn>> conns;
  {
    std::lock_guard lock(s.conns_mu);
    conns.swap(s.conns);
  }
  // Tells clients at once (EOF) and wakes threads blocked in poll(), before the joins.
  for (auto& c : conns) ::shutdown(c->fd.get(), SHUT_RDWR);
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
  }
}

void ConnectionServer::Impl::reap_finished() {
  std::lock_guard lock(conns_mu);
  for (auto it = conns.begin(); it != conns.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      it = conns.erase(it);  // closes the fd
    } else {
      ++it;
    }
  }
}

void ConnectionServer::Impl::accept_loop() {
  while (!stopping.load()) {
    reap_finished();
    auto ready = net::wait_readable(listener.get(), deadline_after(kAcceptSlice), &stopping);
    if (!ready.ok()) continue;
    int err = 0;
    net::Fd fd = net::accept_one(listener.get(), &err);
    if (!fd) {
      // EMFILE and friends: back off instead of spinning on a listener that stays readable.
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED) {
        std::this_thread::sleep_for(kAcceptBackoff);
      }
      continue;
    }
    if (active.load() >= opts.max_connections) {
      ++refused;
      if (refuse) refuse(fd.get());
      continue;  // closes the fd
    }
    start_conn(std::move(fd));
  }
}

void ConnectionServer::Impl::start_conn(net::Fd fd) {
  ++accepted;
  ++active;
  auto conn = std::make_unique<Conn>();
  conn->fd = std::move(fd);
  Conn* raw = conn.get();
  std::lock_guard lock(conns_mu);
  conns.push_back(std::move(conn));
  try {
    raw->thread = std::thread([this, raw] {
      try {
        serve(raw->fd.get());
      } catch (const std::exception&) {
        // Out of memory for a request or similar: lose this connection, not the process.
      }
      --active;
      raw->done = true;
    });
  } catch (const std::system_error&) {
    conns.pop_back();  // no thread to serve it: close it
    --active;
    ++refused;
  }
}

}  // namespace weightcast::comm
