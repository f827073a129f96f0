// EngineHttp: the tests' one HTTP client for a weightcast engine. Every call has connect, read
// and write timeouts and answers an HttpAnswer (status, the body parsed as JSON, the raw text)
// instead of an httplib result, so a transport error is status 0 with the error as the message;
// the typed reads parse with the shared schemas (sync/protocol/protocol.h). Each call uses its
// own connection, so one EngineHttp may be used from several threads.
//
// Tests that act as a trainer use sync/trainer/http/engine_client.h instead. Raw httplib stays
// where a test must send what no client would, on purpose: tests/sync/engine/http_input_test.cc
// (wrong methods, oversized bodies, missing and wrong tokens, the Allow header), tests/security/
// (any method, crafted headers and bodies, raw bytes) and tests/sync/engine/http_fixture.h's
// make_client() for those and for the route table's header checks.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "sync/protocol/protocol.h"

namespace weightcast::testing {

struct HttpAnswer {
  int status = 0;       // 0: no answer
  nlohmann::json body;  // the body as JSON (discarded when it is not JSON); on no answer
                        // {"message": the transport error}
  std::string text;     // the body as sent
  std::string content_type;
};

struct HttpTimeouts {
  std::chrono::milliseconds connect{5000};
  std::chrono::milliseconds read{20000};
  std::chrono::milliseconds write{5000};
};

class EngineHttp {
 public:
  // `url`: "http://host:port"; `token`: sent as a bearer token when not empty.
  explicit EngineHttp(std::string url, HttpTimeouts timeouts = {}, std::string token = "");
  EngineHttp(const std::string& host, int port, HttpTimeouts timeouts = {}, std::string token = "");

  const std::string& url() const { return url_; }

  HttpAnswer get(const std::string& path) const;
  HttpAnswer post(const std::string& path, const std::string& body = "") const;

  // Typed reads; std::runtime_error naming the route on any status but 200.
  sync::ServerInfoResponse server_info() const;
  sync::WeightsChecksumResponse weights_checksum(sync::Runner runner) const;
  std::string metrics() const;  // Prometheus text

 private:
  HttpAnswer ok(const std::string& path) const;

  std::string url_;
  HttpTimeouts timeouts_;
  std::string token_;
};

}  // namespace weightcast::testing
