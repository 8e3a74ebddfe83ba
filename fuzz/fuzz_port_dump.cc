// fuzz/fuzz_port_dump.cc: scenarios::conform::read_port_dump on a directory made from one input: the
// manifest (dump.json), then, after a line "\n--step--\n", the bytes of step_000000.safetensors
// (fuzz/README.md). An input without the separator is all manifest. Corpus shapes of issue 35:
// seed_no_steps (an empty dump), bad_duplicate_steps_key, bad_n_steps_huge, bad_step_file_outside,
// bad_negative_start_pos.
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const fs::path dir = dsv41::fuzz::scratch_dir() / "dump";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  const std::string_view in = dsv41::fuzz::view(data, size);
  constexpr std::string_view kSep = "\n--step--\n";
  const size_t at = in.find(kSep);
  dsv41::fuzz::write_file(dir / "dump.json", in.substr(0, at));
  if (at != std::string_view::npos) {
    dsv41::fuzz::write_file(dir / "step_000000.safetensors", in.substr(at + kSep.size()));
  }
  // A dump the reader accepts (one with no steps included: conform took steps.front() of it, issue
  // 35) must also give its support matrix, what conform prints before any replay.
  dsv41::fuzz::accept([&] {
    const dsv41::scenarios::conform::PortDump d = dsv41::scenarios::conform::read_port_dump(dir.string());
    (void)dsv41::scenarios::conform::support_matrix_lines(d);
  });
  return 0;
}
