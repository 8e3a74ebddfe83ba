// base/env_switch.h: one reading of every on/off environment switch.
#include "base/env_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "tests/support/error_of.h"

namespace dsv41 {
namespace {

TEST(EnvSwitch, UnsetOrEmptyIsTheDefault) {
  for (const bool d : {false, true}) {
    EXPECT_EQ(parse_switch("DSV41_X", nullptr, d), d);
    EXPECT_EQ(parse_switch("DSV41_X", "", d), d);
  }
}

TEST(EnvSwitch, ZeroAndOneOverrideTheDefault) {
  for (const bool d : {false, true}) {
    EXPECT_FALSE(parse_switch("DSV41_X", "0", d));
    EXPECT_TRUE(parse_switch("DSV41_X", "1", d));
  }
}

TEST(EnvSwitch, AnyOtherValueIsAnErrorNamingTheVariable) {
  for (const char* bad : {"on", "true", "2", " 1", "1 ", "yes", "01"}) {
    const std::string e = test::error_of([&] { parse_switch("DSV41_CUDA_ASYNC_UPLOADS", bad, false); });
    EXPECT_NE(e.find("DSV41_CUDA_ASYNC_UPLOADS: '" + std::string(bad) + "' is not 0 or 1 (unset: 0)"), std::string::npos)
        << e;
  }
  EXPECT_NE(test::error_of([] { parse_switch("DSV41_CUDA_ALLOC_POOL", "off", true); }).find("(unset: 1)"),
            std::string::npos);
}

TEST(EnvSwitch, ReadsTheEnvironment) {
  ::setenv("DSV41_ENV_SWITCH_TEST", "1", 1);
  EXPECT_TRUE(env_switch("DSV41_ENV_SWITCH_TEST", false));
  ::setenv("DSV41_ENV_SWITCH_TEST", "0", 1);
  EXPECT_FALSE(env_switch("DSV41_ENV_SWITCH_TEST", true));
  ::setenv("DSV41_ENV_SWITCH_TEST", "maybe", 1);
  EXPECT_THROW(env_switch("DSV41_ENV_SWITCH_TEST", true), Error);
  ::unsetenv("DSV41_ENV_SWITCH_TEST");
  EXPECT_TRUE(env_switch("DSV41_ENV_SWITCH_TEST", true));
}

}  // namespace
}  // namespace dsv41
