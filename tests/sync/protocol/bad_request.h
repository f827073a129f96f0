// Test helper: runs `f`, requires it to throw comm::BadRequestError, returns the message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "comm/errors.h"

namespace weightcast::sync {

template <typename F>
std::string bad_request(F&& f) {
  try {
    f();
  } catch (const comm::BadRequestError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no BadRequestError";
  return {};
}

}  // namespace weightcast::sync
