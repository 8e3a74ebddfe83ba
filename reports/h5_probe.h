// reports/h5_probe.h
//
// A crafted HDF5 file can crash, hang or exhaust the memory of libhdf5 itself (Debian 12's
// 1.10.8 segfaults, loops or allocates 4 GB inside H5Dread of variable-length strings whose
// global-heap references are corrupt: inputs in fuzz/findings/, docs/errors.md "Fuzzing").
// No check in dsv41's own code can stop that, since the library does the damage before it
// returns. So before dsv41 reads an HDF5 file that comes from outside (a report, a port's dump,
// a forward output), it reads the whole file once in a child process:
//
//   probe_file(path)    forks; the child opens the file, refuses external and user-defined
//                       links, and reads every attribute and every dataset of an integer,
//                       float or string type (the only classes dsv41's readers accept) with
//                       the readers' memory types, whole (as they read) up to 1 GiB, in
//                       slabs of 64 MiB above (the first and the last only above 4 GiB). The parent waits with a deadline.
//
// The verdict: ok (nothing crashed, hung or failed), or a reason naming the object the child was
// reading ("libhdf5 crashed (signal 11) reading dataset '/scenarios/a/metrics/value'", "timed out
// after 30 s reading ...", "HDF5 cannot read attribute 'verdict' of '/'"). Only after an ok does
// the caller read the file in its own process, through the same library calls on the same bytes.
//
// Limits (the child's): a deadline of DSV41_H5_PROBE_TIMEOUT seconds when set, else 30 s plus
// 1 s per 50 MB of file; an address-space limit of 2 GiB plus 8 times the file size above the
// parent's (not under AddressSanitizer, which reserves terabytes of address space). A file is
// probed once per process for one (device, inode, size, modification time, FNV-1a of its bytes
// (of its first and last MiB above 16 MiB)).
//
// What it does not cover: a file changed between the probe and the read (the window is the
// probe's duration); files opened by the golden-vector reader (dsv41's own committed files).
#pragma once

#include <cstdint>
#include <string>

namespace dsv41::reports::h5 {

struct ProbeResult {
  bool ok = true;
  std::string reason;  // empty when ok; else why the file is refused (no path prefix)
};

// The probe's sizes and deadline; the defaults are the ones described above (tests shrink them).
struct ProbeLimits {
  uint64_t whole_read_bytes = uint64_t{1} << 30;  // a dataset read whole up to this
  uint64_t slab_bytes = uint64_t{64} << 20;       // else in slabs of at most this
  uint64_t full_read_bytes = uint64_t{4} << 30;   // above: the first and the last slab only
  double timeout_s = 0;                           // 0: DSV41_H5_PROBE_TIMEOUT, else 30 s + 1 s/50 MB
};

// Reads `path` in a child process as described above. Never throws; a file that does not exist
// or is not HDF5 is "ok" here (the caller's open says what is wrong with it). Only probes with
// the default limits are remembered.
ProbeResult probe_file(const std::string& path, const ProbeLimits& limits = {});

}  // namespace dsv41::reports::h5
