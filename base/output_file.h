// base/output_file.h
//
// The one policy for every file dsv41 writes (docs/cli.md, "Output files"):
//  - an output goes only where a regular file is or where nothing is: a path naming a directory,
//    a character or block device (/dev/null), a FIFO or a socket is refused with a dsv41::Error
//    that names the path and what it is. check_output_path() runs before a verb's work starts, and
//    the check is repeated just before the rename: such a node is never replaced;
//  - a symlink is followed: its final target (a regular file, or refused as above) is replaced
//    atomically and the link itself stays as it was; a dangling link is refused;
//  - the bytes go to a temp file beside the target, "<name>.tmp.<pid>.<n>.<r>" (created exclusively,
//    unique per process and per writer, so concurrent processes never share one), which is
//    fsynced, renamed over the target, and the directory fsynced. A reader sees the old file or
//    the new one, never a mix. On failure the temp file is removed; one left by a killed process
//    (kill -9) is removed by the next successful write of the same output once its pid is gone.
//
// Example:
//   dsv41::output::check_output_path(out, "report");    // up front: fails in milliseconds
//   ...
//   dsv41::output::AtomicOutput f(out, "report");
//   f.write(bytes.data(), bytes.size());
//   f.commit();                                         // or destroyed: the temp file is removed
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dsv41::output {

// Checks that `path` may be written as the output `what` ("report", "session file", …): it does
// not exist (and its directory does) or it is a regular file, directly or through symlinks.
// Returns the path the output will replace (the symlink's final target, or `path` itself).
// Throws dsv41::Error otherwise.
std::string check_output_path(const std::string& path, const std::string& what);

// One atomic write: the temp file is created (exclusively) by the constructor, which checks the
// path first; commit() publishes it. Writers that create the file themselves (HDF5) open
// temp_path() after the constructor and close it before commit().
class AtomicOutput {
 public:
  AtomicOutput(const std::string& path, std::string what);
  ~AtomicOutput();  // not committed: the temp file is removed
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  // Appends to the temp file (throws, removing it, on a write error).
  void write(const void* data, size_t n);
  // fsync, rename over the target (re-checked: still a regular file or absent), fsync the
  // directory, then remove temp files of this output left by processes that no longer run.
  void commit();

  const std::string& path() const { return path_; }        // as given
  const std::string& target() const { return target_; }    // what the rename replaces
  const std::string& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& why);

  std::string path_;
  std::string what_;
  std::string target_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// A directory of files written as one (`forward --dump DIR`, `vectors -o DIR`): the files go to a
// temp directory beside the target, "<name>.tmp.<pid>.<n>.<r>", which commit() fsyncs and renames
// onto the target — absent, or an empty directory (rename(2) replaces it atomically). Until then
// the target is absent or empty, whatever kills the process. Not committed: the temp directory
// is removed; one left by a killed process is removed by the next commit to the same target.
class AtomicDirectory {
 public:
  // `path`: absent (its parent directories are created) or an empty directory; else dsv41::Error.
  AtomicDirectory(const std::string& path, std::string what);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  // Where the files go until commit().
  const std::string& temp_path() const { return temp_; }
  void commit();

 private:
  std::string path_, what_, target_, temp_;
  bool committed_ = false;
};

// A whole file in one call.
void write_file_atomically(const std::string& path, const std::string& what, const void* data, size_t n);

// Outputs never alias inputs (docs/cli.md "Output files", docs/errors.md "Classes"): a verb lists
// every file or directory it reads and every path it writes, then check() refuses, before any
// work, with a dsv41::Error naming both:
//  - an output that is an input (the same st_dev/st_ino, symlinks followed: `-o w.safetensors
//    --weights w.safetensors`, `run s.json -o s.json`);
//  - an output that is an existing file inside an input directory (`agree o -o o/config.json`);
//  - an input directory inside an output directory (written over by it);
//  - two outputs that are one file (`--dump x.h5 -o x.h5`), existing or not (the same name in the
//    same directory).
// Empty paths are skipped (an option not given). Inputs that do not exist are skipped too (their
// reader reports them).
//
// Example:
//   output::VerbFiles io;
//   io.input(a.weights, "weights (--weights)").input(a.config, "config (--config)");
//   io.output(a.output, "report (-o)").output(a.junit, "JUnit file (--junit)");
//   io.check();
class VerbFiles {
 public:
  VerbFiles& input(const std::string& path, const std::string& what);
  // An input that the output given as `updated_by` (the same option value) may replace: the verb
  // reads it whole before it writes that output (`forward --resume S --save-state S` advances a
  // session in place). Every other output is still checked against it.
  VerbFiles& input_updated_by(const std::string& path, const std::string& what, const std::string& updated_by);
  VerbFiles& output(const std::string& path, const std::string& what);
  // An output directory (`--dump DIR`, `vectors -o DIR`): no input may lie inside it.
  VerbFiles& output_directory(const std::string& path, const std::string& what);
  void check() const;

 private:
  struct Entry {
    std::string path, what;
    bool directory = false;
    std::string updated_by;  // an input: the output allowed to replace it ("": none)
  };
  std::vector<Entry> inputs_, outputs_;
};

// `selftest -o DIR` and the like: a directory the tool fills with folders of its own. `path` must
// be absent (it is created, parents too) or an empty directory; an existing non-empty directory,
// or anything else, is refused with a dsv41::Error naming it. What the tool then creates inside
// is the tool's; nothing the user had there is ever removed. create = false: the check only
// (up front, before the work that fills it).
void claim_output_directory(const std::string& path, const std::string& what, bool create = true);

}  // namespace dsv41::output
