// h5/h5_probe.cc: the probe's worker process (h5/h5_probe.h): started, fed one file at
// a time over a socket, watched with a deadline, replaced when it ends. What it does with a file
// is h5/h5_probe_read.cc.
#include "h5/h5_probe.h"

#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "h5/internal/h5_probe_read.h"

// Present only in sanitized builds (weak: null otherwise).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));
extern "C" void __asan_init() __attribute__((weak));

namespace dsv41::h5 {
namespace {

using internal::ProbeShared;

// One request (one SOCK_SEQPACKET message): the file and the limits.
struct Request {
  uint64_t id = 0;
  uint64_t whole_read_bytes = 0, slab_bytes = 0, full_read_bytes = 0;
  uint64_t extra_bytes = 0;  // the address-space allowance above the worker's size; 0: no cap
  char path[PATH_MAX] = {};
};

// One reply: the verdict code (internal::ProbeCode) of request `id`.
struct Reply {
  uint64_t id = 0;
  int32_t code = 0;
  int32_t reusable = 0;  // 0: the worker exits after this reply (libhdf5 kept something open)
};

// A worker reads at most this many files (libhdf5's small leaks on corrupt files stay bounded).
constexpr uint64_t kMaxRequests = 1000;
// The worker's socket descriptor, the only one it keeps besides 0, 1 and 2.
constexpr int kWorkerSocket = 3;

void die_quietly() { _exit(internal::kSanitizer); }

uint64_t address_space_bytes() {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// `inherits_files`: the caller held libhdf5 objects when it forked this worker. libhdf5 in the
// worker then shares those files' state, descriptors included (opening a file the caller holds
// reuses it), so the worker keeps every descriptor and reads one file only: the caller's files
// are not the worker's to hold on to. Otherwise it keeps only its socket and reads file after file.
[[noreturn]] void worker_main(int sock, ProbeShared* sh, pid_t parent, bool inherits_files) {
  // The worker's crashes are the result, not a report: default actions, no core file, no
  // sanitizer or fuzzer callbacks that would write artifacts, nothing printed.
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGALRM, SIGTERM, SIGINT, SIGPIPE}) signal(sig, SIG_DFL);
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(die_quietly);
  // The socket first (the caller may have closed stdout, so that it got descriptor 1 or 2).
  // Inheriting files, it moves to a free descriptor above 2 (3 may be one of those files).
  int ws = kWorkerSocket;
  if (inherits_files) {
    ws = sock > STDERR_FILENO ? sock : fcntl(sock, F_DUPFD, STDERR_FILENO + 1);
    if (ws < 0) _exit(0);
  } else if (sock != kWorkerSocket && dup2(sock, kWorkerSocket) < 0) {
    _exit(0);
  }
  const int devnull = open("/dev/null", O_WRONLY);
  if (devnull >= 0) {
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
  }
  // Only the socket stays open besides 0, 1 and 2: a long-lived copy of the caller's descriptors
  // (a pipe's write end, say) would keep their other ends from seeing the end of them.
  if (!inherits_files) close_range(kWorkerSocket + 1, ~0U, 0);
  // It ends with the caller (or on the end of its socket, below).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  rlimit caller_as{};
  getrlimit(RLIMIT_AS, &caller_as);
  Request req;
  for (;;) {
    const ssize_t n = recv(ws, &req, sizeof req, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof req)) _exit(0);  // the caller closed the socket
    sh->serving.store(req.id);
    sh->where[0] = '\0';
    sh->error[0] = '\0';
    req.path[sizeof req.path - 1] = '\0';
    if (req.extra_bytes > 0) {
      // The cap of this file: the worker's present size plus the allowance (h5_probe.h).
      const uint64_t cap = std::min<uint64_t>(address_space_bytes() + req.extra_bytes, caller_as.rlim_max);
      const rlimit as{cap, caller_as.rlim_max};
      setrlimit(RLIMIT_AS, &as);
    }
    ProbeLimits lim;
    lim.whole_read_bytes = req.whole_read_bytes;
    lim.slab_bytes = req.slab_bytes;
    lim.full_read_bytes = req.full_read_bytes;
    bool clean = false;
    int code = internal::kOk;
    try {
      code = internal::read_file(req.path, sh, lim, &clean);
    } catch (...) {
      _exit(internal::kOutOfMemory);
    }
    if (req.extra_bytes > 0) setrlimit(RLIMIT_AS, &caller_as);
    const Reply rep{req.id, code, clean && !inherits_files ? 1 : 0};
    if (send(ws, &rep, sizeof rep, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof rep) || !clean || inherits_files) _exit(0);
  }
}

// The worker of this process (one at a time, under probe_file's lock).
struct Worker {
  pid_t pid = 0;
  pid_t owner = 0;  // the process that started it: a fork of that process starts its own
  int sock = -1;
  ProbeShared* sh = nullptr;
  dev_t cwd_dev = 0;  // the working directory it was started in (relative paths resolve there)
  ino_t cwd_ino = 0;
  uint64_t served = 0;
  bool reaped = false;  // already waited for (its pid may belong to another process now)
};
Worker g_worker;
uint64_t g_next_id = 0;
std::atomic<long> g_pid{0};
std::atomic<uint64_t> g_started{0}, g_served{0};

std::pair<dev_t, ino_t> working_directory() {
  struct stat st {};
  if (stat(".", &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

// Ends the worker (SIGKILL first when `kill_it`), waits for it and forgets it; its wait status.
// *where / *error (when given): what it last wrote to the shared page, read once it has ended.
int end_worker(bool kill_it, std::string* where = nullptr, std::string* error = nullptr) {
  Worker& w = g_worker;
  int status = 0;
  if (w.owner == getpid()) {
    if (kill_it && !w.reaped) kill(w.pid, SIGKILL);
    close(w.sock);
    while (!w.reaped && waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    close(w.sock);  // a copy inherited through fork(): the worker is the other process's
  }
  if (where != nullptr) *where = w.sh->where[0] != '\0' ? std::string(w.sh->where) : "the file";
  if (error != nullptr) *error = w.sh->error;
  munmap(w.sh, sizeof(ProbeShared));
  w = Worker{};
  g_pid.store(0);
  return status;
}

// The worker, started if there is none (or none usable here); empty on success, else why not.
std::string ensure_worker() {
  Worker& w = g_worker;
  const auto [cwd_dev, cwd_ino] = working_directory();
  if (w.pid > 0) {
    int status = 0;
    const pid_t r = w.owner == getpid() ? waitpid(w.pid, &status, WNOHANG) : -1;
    w.reaped = r != 0;  // ended while idle, or reaped by someone else
    if (w.reaped || w.served >= kMaxRequests || w.cwd_dev != cwd_dev || w.cwd_ino != cwd_ino) end_worker(true);
  }
  if (w.pid > 0) return {};
  void* page = mmap(nullptr, sizeof(ProbeShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return std::string("cannot prepare a reading process: ") + std::strerror(errno);
  auto* sh = new (page) ProbeShared{};
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    const int e = errno;
    munmap(page, sizeof(ProbeShared));
    return std::string("cannot prepare a reading process: ") + std::strerror(e);
  }
  // Whether the caller holds libhdf5 objects (files it reads while it probes another, as
  // `dsv41 agree` does): see worker_main.
  const bool inherits_files = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0;
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    worker_main(sv[1], sh, parent, inherits_files);
  }
  close(sv[1]);
  if (pid < 0) {
    const int e = errno;
    close(sv[0]);
    munmap(page, sizeof(ProbeShared));
    return std::string("cannot start a reading process: ") + std::strerror(e);
  }
  w = Worker{pid, parent, sv[0], sh, cwd_dev, cwd_ino, 0, false};
  g_pid.store(pid);
  g_started.fetch_add(1);
  return {};
}

double now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// How one request ended.
struct Outcome {
  enum How { kReply, kEnded, kTimedOut, kNoWorker } how = kNoWorker;
  int code = 0;    // kReply: the verdict code
  int status = 0;  // kEnded: the worker's wait status
  bool fresh = false;  // the worker had read no file before this one
  std::string where, error;
};

// Sends `req` to the worker (started if needed) and waits up to `limit` seconds. A worker that
// ended before it took the request (killed while idle) is replaced and the request sent again.
Outcome ask(Request& req, double limit) {
  Outcome out;
  for (int attempt = 0;; ++attempt) {
    if (g_worker.pid > 0 && g_worker.owner != getpid()) end_worker(false);
    out.error = ensure_worker();
    if (!out.error.empty()) return out;
    Worker& w = g_worker;
    out.fresh = w.served == 0;
    req.id = ++g_next_id;
    const bool sent = send(w.sock, &req, sizeof req, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof req);
    const double t0 = now_s();
    bool timed_out = false;
    Reply rep;
    ssize_t got = -1;
    while (sent) {
      const double left = limit - (now_s() - t0);
      if (left <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{w.sock, POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min(left * 1000.0 + 1.0, 3.6e6)));
      if (r < 0 && errno == EINTR) continue;  // a signal of the caller's (a fuzzer's alarm)
      if (r == 0) continue;                    // the deadline is checked above
      got = recv(w.sock, &rep, sizeof rep, 0);
      if (got < 0 && errno == EINTR) continue;
      // A reply that came after the deadline is a timeout too (the limit is the probe's).
      timed_out = now_s() - t0 > limit;
      break;
    }
    if (timed_out) {
      out.how = Outcome::kTimedOut;
      end_worker(true, &out.where, &out.error);
      return out;
    }
    if (got == static_cast<ssize_t>(sizeof rep) && rep.id == req.id) {
      // It replied, so it waits for the next request: the page is not being written.
      out.where = w.sh->where[0] != '\0' ? std::string(w.sh->where) : "the file";
      out.error = w.sh->error;
      ++w.served;
      g_served.fetch_add(1);
      out.how = Outcome::kReply;
      out.code = rep.code;
      if (rep.reusable == 0) end_worker(false);  // it exits after this reply
      return out;
    }
    // The worker ended (its socket closed) or the socket failed.
    const bool taken = w.sh->serving.load() == req.id;
    out.status = end_worker(true, &out.where, &out.error);
    if (!taken && attempt == 0) continue;
    out.how = Outcome::kEnded;
    return out;
  }
}

double deadline_s(uint64_t file_bytes, const ProbeLimits& lim) {
  if (lim.timeout_s > 0) return lim.timeout_s;
  if (const char* env = std::getenv("DSV41_H5_PROBE_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return 30.0 + static_cast<double>(file_bytes) / 50e6;
}

std::string signal_text(int sig) {
  const char* name = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (name != nullptr ? std::string(", SIG") + name : std::string());
}

// FNV-1a (over 8-byte words) of the file's bytes (of its first and last MiB above 16 MiB): a file rewritten in
// place within one tick of the modification time keeps its other key fields.
uint64_t fingerprint(const std::string& path, off_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const off_t whole = off_t{16} << 20, part = off_t{1} << 20;
  // Read in blocks of 64 KiB (a buffer of the whole part would be zeroed for every probe).
  std::vector<unsigned char> buf(size_t{64} << 10);
  for (const auto& [from, len] : size <= whole ? std::vector<std::pair<off_t, off_t>>{{0, size}}
                                                : std::vector<std::pair<off_t, off_t>>{{0, part}, {size - part, part}}) {
    off_t done = 0;
    while (done < len) {
      const ssize_t n = pread(fd, buf.data(), std::min(buf.size(), static_cast<size_t>(len - done)), from + done);
      if (n <= 0) break;
      // FNV-1a over 8-byte words, then the tail bytes (one step per byte was a seventh of a
      // fuzz_report input's time under coverage instrumentation).
      const size_t len8 = static_cast<size_t>(n) & ~size_t{7};
      for (size_t i = 0; i < len8; i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, buf.data() + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;  // the high bits of a word reach the low ones
      }
      for (size_t i = len8; i < static_cast<size_t>(n); ++i) h = (h ^ buf[i]) * 0x100000001b3ull;
      done += n;
    }
  }
  close(fd);
  return h;
}

}  // namespace

ProbeResult probe_file(const std::string& path, const ProbeLimits& lim) {
  const ProbeLimits defaults;
  const bool remember = lim.whole_read_bytes == defaults.whole_read_bytes && lim.slab_bytes == defaults.slab_bytes &&
                        lim.full_read_bytes == defaults.full_read_bytes && lim.timeout_s == defaults.timeout_s;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return {};
  using Key = std::tuple<dev_t, ino_t, off_t, time_t, long, uint64_t>;
  const Key key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, fingerprint(path, st.st_size)};
  // The verdicts of the last kRemembered files, in a ring: a file read before, unchanged, gets
  // its verdict again without a request (a refusal too: `report check` reads a file twice, and a
  // file on which libhdf5 loops would cost the deadline each time). No allocation per file (a
  // fuzzer's leak check counts allocations an input leaves behind): a reason is kept only if it
  // fits the entry's buffer.
  struct Remembered {
    Key key{};
    bool ok = true, opens = true, not_hdf5 = false;
    uint16_t reason_len = 0;
    char reason[1024];
  };
  constexpr size_t kRemembered = 256;
  static std::mutex mu;
  static std::array<Remembered, kRemembered> probed{};
  static size_t next = 0, filled = 0;
  const std::lock_guard<std::mutex> lock(mu);
  if (remember) {
    for (size_t i = 0; i < filled; ++i) {
      const Remembered& e = probed[i];
      if (e.key != key) continue;
      ProbeResult again;
      again.ok = e.ok;
      again.opens = e.opens;
      again.not_hdf5 = e.not_hdf5;
      again.reason.assign(e.reason, e.reason_len);
      return again;
    }
  }

  Request req;
  if (path.size() >= sizeof req.path) return {false, "the path is too long to read"};
  std::memcpy(req.path, path.data(), path.size());
  req.whole_read_bytes = lim.whole_read_bytes;
  req.slab_bytes = lim.slab_bytes;
  req.full_read_bytes = lim.full_read_bytes;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // No cap under AddressSanitizer, which reserves terabytes of address space.
  req.extra_bytes = __asan_init == nullptr ? (uint64_t{2} << 30) + 8 * size : 0;
  const double limit = deadline_s(size, lim);
  Outcome o = ask(req, limit);
  // A crash in a worker that had read other files is confirmed by a new one that read nothing
  // before (the verdict is then the file's, as with a process of its own per file).
  if (o.how == Outcome::kEnded && !o.fresh) o = ask(req, limit);

  ProbeResult out;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", limit);
  const std::string& where = o.where;
  const int status = o.status;
  if (o.how == Outcome::kNoWorker) {
    out = {false, o.error};
  } else if (o.how == Outcome::kTimedOut) {
    out = {false, "libhdf5 did not finish reading " + where + " within " + secs +
                      " s (a corrupt or crafted file; DSV41_H5_PROBE_TIMEOUT sets the limit)"};
  } else if (o.how == Outcome::kEnded && WIFSIGNALED(status)) {
    out = {false, "libhdf5 crashed (" + signal_text(WTERMSIG(status)) + ") reading " + where +
                      ": the file is corrupt or crafted"};
  } else {
    // A worker that ended by itself has no verdict but its exit status (kSanitizer, kOutOfMemory).
    const int code = o.how == Outcome::kReply ? o.code : WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const bool verdict = o.how == Outcome::kReply || code == internal::kSanitizer || code == internal::kOutOfMemory;
    switch (verdict ? code : -1) {
      case internal::kOk: break;
      case internal::kNotHdf5: out.opens = false; out.not_hdf5 = true; break;
      case internal::kCannotOpen: out.opens = false; break;
      case internal::kReadFailed: out = {false, where + ": " + o.error + " (the file is corrupt, or needs more than the reading limit)"}; break;
      case internal::kForeignLink: out = {false, where + " is " + o.error}; break;
      case internal::kSanitizer: out = {false, "libhdf5 failed a memory-safety check reading " + where + ": the file is corrupt or crafted"}; break;
      case internal::kOutOfMemory: out = {false, "reading " + where + " ran out of memory"}; break;
      default: out = {false, "the reading process ended with code " + std::to_string(code) + " at " + where};
    }
  }
  // Not remembered: a worker that could not be started (the next call may start one).
  if (remember && o.how != Outcome::kNoWorker && out.reason.size() <= sizeof(Remembered::reason)) {
    Remembered& e = probed[next];
    e.key = key;
    e.ok = out.ok;
    e.opens = out.opens;
    e.not_hdf5 = out.not_hdf5;
    e.reason_len = static_cast<uint16_t>(out.reason.size());
    std::memcpy(e.reason, out.reason.data(), out.reason.size());
    next = (next + 1) % kRemembered;
    filled = std::min(filled + 1, kRemembered);
  }
  return out;
}

ProbeWorker probe_worker() { return {g_pid.load(), g_started.load(), g_served.load()}; }

}  // namespace dsv41::h5
