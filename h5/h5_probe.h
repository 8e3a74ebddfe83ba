// h5/h5_probe.h
//
// A crafted HDF5 file can crash, hang or exhaust the memory of libhdf5 itself (Debian 12's
// 1.10.8 segfaults, loops or allocates 4 GB inside H5Dread of variable-length strings whose
// global-heap references are corrupt: inputs in fuzz/findings/, docs/errors.md "Fuzzing").
// No check in dsv41's own code can stop that, since the library does the damage before it
// returns. So before dsv41 reads an HDF5 file that comes from outside (a report, a port's dump,
// a forward output), it reads the whole file once in another process, the probe's worker:
//
//   probe_file(path)    the worker (a fork of this process, started at the first probe and kept
//                       for the next ones) opens the file, refuses external and user-defined
//                       links, reads every attribute and every dataset of an integer, float or
//                       string type (the only classes dsv41's readers accept) with the readers'
//                       memory types, whole (as they read) up to 1 GiB, in slabs of 64 MiB above
//                       (the first and the last only above 4 GiB), and closes it. This process
//                       waits for its answer with a deadline.
//
// The verdict: ok (nothing crashed, hung or failed), or a reason naming the object the worker was
// reading ("libhdf5 crashed (signal 11) reading dataset '/scenarios/a/metrics/value'", "timed out
// after 30 s reading ...", "HDF5 cannot read attribute 'verdict' of '/'"). Only after an ok does
// the caller read the file in its own process, through the same library calls on the same bytes.
//
// The worker: a worker that crashed, hung (killed at the deadline) or left anything of a file
// open in libhdf5 is gone, and the next probe starts a new one; a crash of a worker that had read
// other files before is confirmed by a new worker before the file is refused (so the verdict is
// the file's alone, as with a process per file). One that ended while idle (killed from outside)
// is replaced and the file sent again. A worker is also replaced after 1000 files, when this
// process's working directory changed (relative paths) and in a fork of this process (it starts
// its own). It keeps no descriptor of this process's but its socket, and ends with this process.
// Except: a worker forked while this process holds libhdf5 objects (`dsv41 agree` reads the
// official runs while it probes the next file) shares libhdf5's state of those files, descriptors
// included, so it keeps every descriptor and reads one file only (a fork per file).
//
// Limits (the worker's, per file): a deadline of DSV41_H5_PROBE_TIMEOUT seconds when set, else
// 30 s plus 1 s per 50 MB of file; an address-space limit of 2 GiB plus 8 times the file size
// above the worker's size when it starts reading it (not under AddressSanitizer, which reserves
// terabytes of address space). The verdicts of the last 256 files, clean or refused, are
// remembered, and those files are not probed again while their (device, inode, size,
// modification time, FNV-1a over 8-byte words of their bytes (of the first and last MiB above
// 16 MiB)) stay the same.
//
// What it does not cover: a file changed between the probe and the read (the window is the
// probe's duration); files opened by the golden-vector reader (dsv41's own committed files).
#pragma once

#include <cstdint>
#include <string>

namespace dsv41::h5 {

struct ProbeResult {
  bool ok = true;
  std::string reason;  // empty when ok; else why the file is refused (no path prefix)
  // With ok: false when libhdf5 cannot open the file (not_hdf5: it is not an HDF5 file at all).
  // The caller then says so without opening it in its own process: libhdf5 loses memory on a
  // failed open of a corrupt file, and a file it cannot open is read by no one.
  bool opens = true;
  bool not_hdf5 = false;
};

// The probe's sizes and deadline; the defaults are the ones described above (tests shrink them).
struct ProbeLimits {
  uint64_t whole_read_bytes = uint64_t{1} << 30;  // a dataset read whole up to this
  uint64_t slab_bytes = uint64_t{64} << 20;       // else in slabs of at most this
  uint64_t full_read_bytes = uint64_t{4} << 30;   // above: the first and the last slab only
  double timeout_s = 0;                           // 0: DSV41_H5_PROBE_TIMEOUT, else 30 s + 1 s/50 MB
};

// Reads `path` in the worker as described above. Never throws; a file that does not exist is
// "ok" here (the caller's open says what is wrong with it); one libhdf5 cannot open is "ok" with
// `opens` false. Only probes with
// the default limits are remembered.
ProbeResult probe_file(const std::string& path, const ProbeLimits& limits = {});

// The worker, for tests: its process id (0: none running), how many workers this process started
// and how many files they answered for.
struct ProbeWorker {
  long pid = 0;
  uint64_t started = 0;
  uint64_t served = 0;
};
ProbeWorker probe_worker();

}  // namespace dsv41::h5
