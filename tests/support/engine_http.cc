#include "tests/support/engine_http.h"

#include <httplib.h>

#include <stdexcept>

namespace weightcast::testing {
namespace {

HttpAnswer to_answer(const httplib::Result& res) {
  HttpAnswer out;
  if (!res) {
    out.body = {{"message", httplib::to_string(res.error())}};
    return out;
  }
  out.status = res->status;
  out.text = res->body;
  out.body = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  out.content_type = res->get_header_value("Content-Type");
  return out;
}

}  // namespace

EngineHttp::EngineHttp(std::string url, HttpTimeouts timeouts, std::string token)
    : url_(std::move(url)), timeouts_(timeouts), token_(std::move(token)) {}

EngineHttp::EngineHttp(const std::string& host, int port, HttpTimeouts timeouts, std::string token)
    : EngineHttp("http://" + host + ":" + std::to_string(port), timeouts, std::move(token)) {}

namespace {

void configure(httplib::Client& c, const HttpTimeouts& t, const std::string& token) {
  c.set_keep_alive(false);
  c.set_connection_timeout(t.connect);
  c.set_read_timeout(t.read);
  c.set_write_timeout(t.write);
  if (!token.empty()) c.set_bearer_token_auth(token);
}

}  // namespace

HttpAnswer EngineHttp::get(const std::string& path) const {
  httplib::Client c(url_);
  configure(c, timeouts_, token_);
  return to_answer(c.Get(path));
}

HttpAnswer EngineHttp::post(const std::string& path, const std::string& body) const {
  httplib::Client c(url_);
  configure(c, timeouts_, token_);
  return to_answer(c.Post(path, body, "application/json"));
}

HttpAnswer EngineHttp::ok(const std::string& path) const {
  HttpAnswer a = get(path);
  if (a.status != 200) {
    throw std::runtime_error(url_ + " GET " + path + " answered " + std::to_string(a.status) +
                             ": " + (a.status == 0 ? a.body.dump() : a.text));
  }
  return a;
}

sync::ServerInfoResponse EngineHttp::server_info() const {
  return sync::parse_server_info_response(ok("/server_info").text);
}

sync::WeightsChecksumResponse EngineHttp::weights_checksum(sync::Runner runner) const {
  return sync::parse_weights_checksum_response(
      ok("/weights_checksum?runner=" + std::string(sync::to_string(runner))).text);
}

std::string EngineHttp::metrics() const {
  return ok("/metrics").text;
}

}  // namespace weightcast::testing
