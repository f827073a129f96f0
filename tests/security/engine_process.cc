#include "tests/security/engine_process.h"

#include <httplib.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/engine_launch.h"

#ifndef WEIGHTCAST_ENGINE_BIN
#error "WEIGHTCAST_ENGINE_BIN must name the weightcast-engine executable"
#endif
#ifndef WEIGHTCAST_STORE_SERVER_BIN
#error "WEIGHTCAST_STORE_SERVER_BIN must name the test's store server executable"
#endif

namespace weightcast::security {

using namespace std::chrono_literals;

std::string HttpReply::message() const {
  if (json.is_object() && json.contains("message") && json["message"].is_string()) {
    return json["message"].get<std::string>();
  }
  return "";
}

std::ostream& operator<<(std::ostream& os, const EngineState& s) {
  os << "{in_session=" << s.in_session << " selector=" << s.session_selector
     << " paused=" << s.paused << " version=" << s.weight_version << " target=" << s.target_digest
     << " draft=" << s.draft_digest << " ok=" << s.updates_ok << " failed=" << s.updates_failed
     << " flushes=" << s.cache_flushes << " groups=[";
  for (const auto& g : s.groups) os << g << ' ';
  return os << "]}";
}

namespace {

// "host:port" split at its last colon.
std::pair<std::string, int> split_url(const std::string& rest) {
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("no port in '" + rest + "'");
  return {rest.substr(0, colon), std::stoi(rest.substr(colon + 1))};
}

// The value of the first sample of `metric` (the whole line prefix) in Prometheus text.
std::string metric_value(const std::string& text, const std::string& metric) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(metric + " ", 0) == 0) return line.substr(metric.size() + 1);
  }
  return "(absent)";
}

}  // namespace

EngineProcess::EngineProcess(std::vector<std::string> extra, std::string token)
    : process_([&] {
        std::vector<std::string> flags = {"--draft-filter",    "mtp.*", "--init-timeout-ms", "3000",
                                          "--comm-timeout-ms", "3000",  "--chunk-bytes",     "64K"};
        if (!token.empty()) {
          flags.push_back("--token");
          flags.push_back(token);
        }
        flags.insert(flags.end(), extra.begin(), extra.end());
        return testing::Subprocess(
            testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, /*ranks=*/1, /*seed=*/3, flags));
      }()),
      token_(std::move(token)) {
  const std::string url = testing::wait_for_engine_url(process_, 20s);
  std::tie(host_, port_) = split_url(url.substr(url.find("://") + 3));
}

HttpReply EngineProcess::call(const std::string& method, const std::string& path,
                              const std::string& body, const std::string& auth) const {
  httplib::Client c(host_, port_);
  c.set_connection_timeout(5s);
  c.set_read_timeout(20s);
  c.set_write_timeout(5s);
  httplib::Headers headers;
  if (!auth.empty()) headers.emplace("Authorization", auth);
  httplib::Result res = method == "GET"    ? c.Get(path, headers)
                        : method == "POST" ? c.Post(path, headers, body, "application/json")
                        : method == "PUT"  ? c.Put(path, headers, body, "application/json")
                                           : c.Delete(path, headers, body, "application/json");
  HttpReply out;
  if (!res) {
    out.body = httplib::to_string(res.error());
    return out;
  }
  out.status = res->status;
  out.body = res->body;
  out.json = Json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  for (const auto& [k, v] : res->headers) out.headers.emplace(k, v);
  return out;
}

EngineState EngineProcess::state() const {
  EngineState s;
  const HttpReply info = get("/server_info");
  if (info.status != 200 || !info.json.is_object()) {
    throw std::runtime_error("/server_info answered " + std::to_string(info.status) + ": " +
                             info.body);
  }
  const Json& j = info.json;
  s.in_session = j.value("in_session", false);
  s.session_selector = j.value("session_selector", Json()).dump();
  s.paused = j.value("paused", false);
  s.weight_version = j.value("weight_version", "");
  for (const auto& g : j.value("groups", Json::array())) {
    s.groups.push_back(g.value("group_name", "") + ":" + g.value("aborted", Json()).dump() + ":" +
                       g.value("buckets_received", Json()).dump() + ":" +
                       g.value("bytes_received", Json()).dump());
  }
  s.target_digest = get("/weights_checksum?runner=target").json.value("digest", "");
  s.draft_digest = get("/weights_checksum?runner=draft").json.value("digest", "");
  const std::string metrics = get("/metrics").body;
  s.updates_ok = metric_value(metrics, "weightcast_engine_updates_total{outcome=\"ok\"}");
  s.updates_failed = metric_value(metrics, "weightcast_engine_updates_total{outcome=\"failed\"}");
  s.cache_flushes = metric_value(metrics, "weightcast_engine_cache_flushes_total");
  return s;
}

StoreProcess::StoreProcess(std::vector<std::string> args)
    : process([&] {
        args.insert(args.begin(), WEIGHTCAST_STORE_SERVER_BIN);
        return testing::Subprocess(args);
      }()) {
  auto rest = process.wait_for_line("store listening on ", 20s);
  if (!rest) throw std::runtime_error("store server did not start: " + process.drain(1s));
  std::tie(host, port) = split_url(*rest);
}

std::size_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

}  // namespace weightcast::security
