// Helpers for the op tests of kernels-b's families: float-rounded inputs (so the float path and the
// double reference see identical values) and an Error check that inspects the message.
#pragma once

#include <initializer_list>
#include <string>

#include "testing.h"

namespace tessera::testing {

// x rounded to float and back: the float path and the double reference then start equal.
inline HostTensor<double> float_rounded(const HostTensor<double>& x) { return x.cast<float>().cast<double>(); }

// Expects fn() to throw tessera::Error whose message contains every one of parts.
template <typename F>
void expect_error(F&& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    for (const char* p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "missing \"" << p << "\" in: " << e.what();
  }
}

}  // namespace tessera::testing
