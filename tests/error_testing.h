// The one helper for "f throws a tessera::Error whose message says ...", shared by every suite:
// EXPECT_TRUE(throws_with(f, {"part", ...})) names the missing part, or the exception that was
// not an Error, or that nothing was thrown; error_of(f) gives the message for exact comparisons.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/check.h"

namespace tessera::testing {

// The message of the tessera::Error that f throws; "" when it throws none. Other exceptions pass
// through (gtest reports them as failures).
template <typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs f, expecting a tessera::Error (a user error, not a crash) whose message contains every one
// of `parts`.
template <typename F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<std::string> parts) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos) return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << msg;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not a tessera::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception";
}

}  // namespace tessera::testing
