// fuzz/fuzz_config.cc: reference::parse_config on arbitrary bytes (a config.json's text).
#include "fuzz/fuzz_util.h"
#include "reference/ops/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(dsv41::fuzz::view(data, size));
  dsv41::fuzz::accept([&] {
    const dsv41::reference::ModelConfig c = dsv41::reference::parse_config(text, "fuzz.json");
    // What a caller does next with a parsed config: its hash, its JSON, its layer schedule.
    (void)dsv41::reference::config_hash(c);
    (void)dsv41::reference::to_json_string(c);
    (void)dsv41::reference::layer_schedule(c);
  });
  return 0;
}
