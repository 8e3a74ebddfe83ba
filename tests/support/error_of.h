// tests/support/error_of.h
//
// error_of(fn): runs fn and returns the message of the dsv41::Error it throws; records a test
// failure (and returns "") when it throws none. For EXPECT_THAT(msg, HasSubstr(...)) checks of
// what an error names.
//
// Example:
//   EXPECT_THAT(error_of([&] { pack_rows(f, x, 3, 64); }), HasSubstr("row 2"));
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace dsv41::test {

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dsv41::Error";
  return "";
}

}  // namespace dsv41::test
