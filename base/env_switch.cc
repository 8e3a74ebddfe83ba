// base/env_switch.cc: see env_switch.h.
#include "base/env_switch.h"

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace dsv41 {

bool parse_switch(const char* name, const char* value, bool default_on) {
  if (value == nullptr || *value == '\0') return default_on;
  const std::string v(value);
  if (v == "0") return false;
  if (v == "1") return true;
  DSV41_FAIL(name, ": '", v, "' is not 0 or 1 (unset: ", default_on ? "1" : "0", ")");
}

bool env_switch(const char* name, bool default_on) { return parse_switch(name, std::getenv(name), default_on); }

}  // namespace dsv41
