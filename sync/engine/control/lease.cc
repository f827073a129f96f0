#include "sync/engine/control/lease.h"

#include <cmath>
#include <cstdio>

#include "comm/errors.h"
#include "sync/engine/control/secret.h"

namespace weightcast::sync::engine {

namespace {

std::string seconds_text(double s) {
  char out[32];
  std::snprintf(out, sizeof(out), "%.0f", std::ceil(s));
  return out;
}

}  // namespace

double Lease::seconds_left(Clock::time_point now) const {
  if (!alive(now)) return 0;
  return std::chrono::duration<double>(expires_ - now).count();
}

std::optional<Refusal> Lease::check(const std::optional<std::string>& holder,
                                    const std::optional<std::string>& lease_id,
                                    std::string_view route, Clock::time_point now) const {
  if (!alive(now)) return std::nullopt;
  if (holder && lease_id && constant_time_equal(*lease_id, id_)) return std::nullopt;
  std::string why = lease_id ? "its lease_id is not the live lease's"
                    : holder ? "it carries no lease_id"
                             : "an id-less client cannot share a leased engine";
  return Refusal{409, std::string(route) + ": engine leased by '" + holder_ + "' for " +
                          seconds_text(seconds_left(now)) + " more s (" + why +
                          "); the lease ends when its holder releases it, after " +
                          std::to_string(ttl_.count() / 1000) +
                          " s without a session of its holder, or with POST "
                          "/release_weight_update_lease {\"force\": true}"};
}

const std::string& Lease::take(const std::string& holder, comm::Millis ttl, Clock::time_point now) {
  WC_ENFORCE_GT(ttl.count(), 0, "lease time to live");
  if (!alive(now)) {
    id_ = random_hex(16);
    holder_ = holder;
  }
  ttl_ = ttl;
  expires_ = now + ttl_;
  return id_;
}

void Lease::renew(Clock::time_point now) {
  if (alive(now)) expires_ = now + ttl_;
}

std::optional<Refusal> Lease::release(const std::optional<std::string>& lease_id, bool force,
                                      Clock::time_point now) {
  if (!alive(now)) {
    id_.clear();
    return std::nullopt;
  }
  if (!force && !(lease_id && constant_time_equal(*lease_id, id_))) {
    return Refusal{409, "release_weight_update_lease: the lease is held by '" + holder_ +
                            "' and this lease_id is not its id; an operator may break it with "
                            "{\"force\": true}"};
  }
  id_.clear();
  holder_.clear();
  return std::nullopt;
}

}  // namespace weightcast::sync::engine
