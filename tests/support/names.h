// Checks shared by the tests of the protocol's named enums (selector, runner, dtype, layout): the
// name functions both ways, and refusals of unknown names.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "comm/errors.h"

namespace weightcast::testing {

// parse(name) == value and to_string(value) == name for every pair; parse(name) throws
// comm::BadRequestError for every name in `refused`.
template <typename Parse, typename Enum = std::invoke_result_t<Parse, std::string>>
void expect_names(Parse parse, std::initializer_list<std::pair<std::string, Enum>> names,
                  std::initializer_list<std::string> refused = {}) {
  for (const auto& [name, value] : names) {
    EXPECT_EQ(parse(name), value) << name;
    EXPECT_EQ(to_string(value), name);
  }
  for (const std::string& bad : refused) {
    EXPECT_THROW(parse(bad), comm::BadRequestError) << "'" << bad << "'";
  }
}

// parse(bad) throws comm::BadRequestError whose message quotes the value and contains `listed`
// (the valid names), for every name in `bad_names`.
template <typename Parse>
void expect_refusals_name_the_value(Parse parse, std::initializer_list<std::string> bad_names,
                                    const std::string& listed) {
  for (const std::string& bad : bad_names) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const comm::BadRequestError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(listed), std::string::npos) << what;
    }
  }
}

}  // namespace weightcast::testing
