// base/env_switch.h: the on/off environment switches (DSV41_CUDA_DEFER_CHECKS, DSV41_REF_OP_TIMES, ...),
// read one way everywhere: unset or "" gives the switch's default, "0" off, "1" on, and any other
// value is a dsv41::Error naming the variable and the value (a typo never silently means "off").
//
//   static const bool on = dsv41::env_switch("DSV41_CUDA_ASYNC_UPLOADS", /*default_on=*/false);
#pragma once

namespace dsv41 {

// The switch's value as parse_switch reads getenv(name).
bool env_switch(const char* name, bool default_on);

// value (nullptr: unset) of the variable `name`: nullptr or "" -> default_on, "0" -> false, "1" -> true;
// anything else throws.
bool parse_switch(const char* name, const char* value, bool default_on);

}  // namespace dsv41
