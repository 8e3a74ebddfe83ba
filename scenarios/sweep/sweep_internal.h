// scenarios/sweep/sweep_internal.h (internal to the sweep: sweep.cc, sweep_item.cc)
//
// One rank's side of a sweep: the item process it runs (ItemProcess: spawned, polled, killed on
// timeout) and what it reports about an item to rank 0 (ItemOutcome, a message).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsv41::scenarios::sweep {

inline constexpr int kTagRequest = 1;  // rank -> 0: give me an item
inline constexpr int kTagItem = 2;     // 0 -> rank: an item index, or -1: no more
inline constexpr int kTagResult = 3;   // rank -> 0: an ItemOutcome (and a request for the next item)

// What a rank knows about one item it ran.
struct ItemOutcome {
  int64_t item = -1;
  int64_t rank = -1;
  std::string host, gpu;
  double seconds = 0;
  std::string exit;                  // "ok", "exit N", "signal N (name)", "timeout after S s", "could not start: ..."
  std::string log_tail;              // the end of the item process's output (for an error message)
  std::vector<uint8_t> report;       // the item's report file; empty when it wrote none
  std::vector<uint8_t> encode() const;
  static ItemOutcome decode(const std::vector<uint8_t>& bytes);
};

// A child process running argv with stdout and stderr appended to log_path and `env` added to
// this process's environment. Never throws once started; a process still running when the object
// is destroyed is killed.
class ItemProcess {
 public:
  ItemProcess(const std::vector<std::string>& argv, const std::string& log_path,
              const std::vector<std::pair<std::string, std::string>>& env, double timeout_seconds);
  ~ItemProcess();
  ItemProcess(const ItemProcess&) = delete;
  ItemProcess& operator=(const ItemProcess&) = delete;
  // True once the process has ended (or could not start); then exit() and ok() are final.
  bool poll();
  bool ok() const { return ok_; }
  const std::string& exit() const { return exit_; }
  double seconds() const;

 private:
  pid_t pid_ = -1;
  bool done_ = false, ok_ = false;
  std::string exit_;
  double timeout_ = 0;
  std::chrono::steady_clock::time_point start_, end_;
};

// The last `max_bytes` of a file, from a line start (empty when it cannot be read).
std::string file_tail(const std::string& path, size_t max_bytes);

// This executable's path (/proc/self/exe), for the item processes.
std::string self_executable();

}  // namespace dsv41::scenarios::sweep
