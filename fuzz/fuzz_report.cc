// fuzz/fuzz_report.cc: reports::read_report (with tensors) and check_report_schema on arbitrary
// bytes written to a scratch .h5 file: dsv41's report reader over what libhdf5 accepts; what it
// reads goes through everything that prints a report (the summary and its profiles, a diff with
// itself, the HTML page).
#include "fuzz/fuzz_util.h"
#include "reports/report.h"
#include "reports/report_diff.h"
#include "reports/report_html.h"

#include <hdf5.h>

#include <cstdlib>

// The reader probes each file in the probe's worker process first (h5/h5_probe.h); its
// deadline must stay below libFuzzer's -timeout (scripts/fuzz.sh: 10 s), so that a hang inside
// libhdf5 is the probe's refusal, not a timeout of the fuzzer. It is 0.5 s here: a valid seed
// is probed in milliseconds, while each input on which libhdf5 loops costs the whole deadline
// (with a 4 s deadline these took about half of a run's time, measured with perf; 84 -> 185
// exec/s on one core, 60 s, seed 1). DSV41_H5_PROBE_TIMEOUT set outside still wins.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("DSV41_H5_PROBE_TIMEOUT", "0.5", 0);
  // libhdf5 keeps the blocks it frees on its own free lists up to 1 MB per list by default;
  // a file's open callocs blocks above that, which ASan then maps and unmaps afresh for every
  // input (a fifth of the time in page faults, measured with perf). Without the limits they are
  // reused: 65 -> 102 exec/s on one core (60 s, seed 1). The code under test is the same.
  H5set_free_list_limits(-1, -1, -1, -1, -1, -1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (dsv41::fuzz::scratch_dir() / "fuzz.h5").string();
  dsv41::fuzz::write_file(path, dsv41::fuzz::view(data, size));
  dsv41::fuzz::accept([&] {
    // Only what the reader accepted is printed (format_summary and diff_reports summarize it).
    const dsv41::reports::RunReport r = dsv41::reports::read_report(path, true);
    (void)dsv41::reports::format_summary(r);
    dsv41::reports::SummaryOptions o;
    o.by = "layer";
    (void)dsv41::reports::format_summary(r, o);
    (void)dsv41::reports::diff_reports(r, r, {});
    if (dsv41::reports::html_available()) (void)dsv41::reports::html_page(r, {path});
  });
  dsv41::fuzz::accept([&] { (void)dsv41::reports::check_report_schema(path); });
  return 0;
}
