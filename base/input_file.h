// base/input_file.h
//
// The input-file policy (issue 35, the input classes): every file dsv41 reads is opened by
// InputFile::open, which opens with O_NONBLOCK and fstat()s the descriptor before reading, so a
// FIFO, a device (/dev/zero), a socket or a directory is refused at once ("is a FIFO, not a
// regular file") instead of blocking or reading without end. Text inputs are read whole by
// read_text_file, which first checks the file's size against the limit of its kind (the limits
// below, listed in docs/cli.md "Limits"). Paths handed to a library that opens them itself
// (libhdf5) are checked with require_regular_file first (stat, following symlinks: never blocks).
//
// The memory side of the same policy: check_memory refuses a derived size (computed with
// overflow-checked 64-bit arithmetic: checked_mul / checked_add) larger than the machine's physical
// memory (sysconf _SC_PHYS_PAGES), before anything is allocated.
//
// Example:
//   const std::string text = input::read_text_file(path, "config file", input::kMaxConfigBytes);
//   input::InputFile f = input::InputFile::open(path, "weights file");
//   f.read_at(0, buf, 8);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::input {

// Size limits of the text inputs (docs/cli.md "Limits"); each is far above any real file of its
// kind (the full config is 4 KiB, a million-token prompt ~8 MiB, the largest vector manifest ~1 MiB).
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kMaxConfigBytes = 16 * kMiB;       // a model config (JSON)
inline constexpr uint64_t kMaxIdListBytes = 256 * kMiB;      // --prompt @FILE, --token-map FILE
inline constexpr uint64_t kMaxScenarioBytes = 16 * kMiB;     // a scenario (JSON)
inline constexpr uint64_t kMaxToleranceBytes = 16 * kMiB;    // --tolerances FILE (JSON)
inline constexpr uint64_t kMaxManifestBytes = 256 * kMiB;    // a port dump's dump.json, vectors.json
inline constexpr uint64_t kMaxSweepPlanBytes = 16 * kMiB;    // a sweep plan (JSON)

// A read-only descriptor of a regular file (closed by the destructor).
class InputFile {
 public:
  // Opens `path` without blocking and refuses anything but a regular file (after symlinks):
  // "<what> '<path>': is a FIFO, not a regular file". `what` names the kind ("config file").
  static InputFile open(const std::string& path, const std::string& what);
  InputFile(InputFile&& o) noexcept;
  InputFile& operator=(InputFile&& o) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  uint64_t size() const { return size_; }  // at open
  const std::string& path() const { return path_; }
  const std::string& what() const { return what_; }
  // Reads exactly n bytes at offset (pread); throws naming the file when the file is shorter.
  void read_at(uint64_t offset, void* buf, size_t n) const;
  // Throws "<what> '<path>': N bytes, over the limit of M bytes for a <what> (docs/cli.md
  // \"Limits\")" when the size is above max_bytes.
  void check_size(uint64_t max_bytes) const;

 private:
  InputFile(int fd, uint64_t size, std::string path, std::string what);
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_, what_;
};

// The whole file as text, after InputFile::open and check_size(max_bytes).
std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes);
// The whole file as bytes, after InputFile::open and check_size(max_bytes).
std::vector<uint8_t> read_binary_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// For paths another library opens (libhdf5): throws unless stat(path) (following symlinks) is a
// regular file: "<what> '<path>': cannot open (No such file or directory)" / ": is a directory, not a
// regular file" / ...
void require_regular_file(const std::string& path, const std::string& what);
// "a FIFO", "a directory", "a character device", ... for an st_mode.
std::string file_type_name(unsigned mode);

// The machine's physical memory in bytes (sysconf _SC_PHYS_PAGES x _SC_PAGE_SIZE; 0 if unknown).
uint64_t physical_memory_bytes();
// a * b and a + b, throwing "<what>: ... overflows 64 bits" instead of wrapping.
uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what);
uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what);
// Throws "<what>: needs N bytes (<size>), more than this machine's physical memory (M bytes)"
// when bytes exceeds physical_memory_bytes() (or `limit` when it is nonzero and smaller).
void check_memory(uint64_t bytes, const std::string& what, uint64_t limit = 0);
// "1.5 GiB"-style text of a byte count.
std::string bytes_text(uint64_t bytes);

}  // namespace dsv41::input
