// base/output_file.cc: the output-file policy (base/output_file.h, docs/cli.md "Output files").
#include "base/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "base/error.h"

namespace dsv41::output {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symlink";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, const std::string& why) {
  DSV41_FAIL("cannot write ", what, " '", path, "': ", why,
             " (outputs are written only to regular files or to new paths, never over anything else; "
             "docs/cli.md, Output files)");
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "<name>.tmp.<pid>[.<anything>]": the pid, or 0 when `entry` is not a temp file of `name`.
long temp_owner(const std::string& entry, const std::string& name) {
  const std::string prefix = name + ".tmp.";
  if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) return 0;
  const char* digits = entry.c_str() + prefix.size();
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(digits, &end, 10);
  if (errno != 0 || end == digits || pid <= 0 || (*end != '\0' && *end != '.')) return 0;
  return pid;
}

// Removes temp files of `target` whose writing process no longer runs (left by kill -9).
void remove_stale_temps(const std::string& target) {
  const std::string dir = parent_of(target);
  const std::string name = base_of(target);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const long pid = temp_owner(e->d_name, name);
    if (pid == 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      // Best effort: another writer may have removed it. A temp directory (AtomicDirectory)
      // goes with its files.
      if (::unlinkat(::dirfd(d), e->d_name, 0) != 0 && (errno == EISDIR || errno == EPERM)) {
        std::error_code ec;
        std::filesystem::remove_all(std::filesystem::path(dir) / e->d_name, ec);
      }
    }
  }
  ::closedir(d);
}

// fsync of a directory (best effort: not every file system lets a directory sync).
void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  static const unsigned salt = std::random_device{}();
  return std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) + "." +
         std::to_string(salt % 100000);
}

// Whether `path`, a symlink, is or leads through /dev/ or /proc/ (a stream such as /dev/stdout):
// the first such name on its chain of links, or "".
std::string stream_link(const std::string& path) {
  std::string cur = path;
  for (int hop = 0; hop < 40; ++hop) {
    const std::string abs = std::filesystem::absolute(cur).lexically_normal().string();
    if (abs.rfind("/dev/", 0) == 0 || abs.rfind("/proc/", 0) == 0) return abs;
    char buf[PATH_MAX];
    const ssize_t n = ::readlink(cur.c_str(), buf, sizeof buf - 1);
    if (n < 0) return "";  // not a link (any more): the chain ends outside /dev and /proc
    std::string next(buf, static_cast<size_t>(n));
    cur = next.front() == '/' ? next : parent_of(abs) + "/" + next;
  }
  return "";
}

}  // namespace

std::string check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) refuse(path, what, "the path is empty");
  if (path.back() == '/') refuse(path, what, "the path ends in '/' (a directory)");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) refuse(path, what, std::string("cannot inspect it: ") + std::strerror(errno));
    // A new file: its directory must exist.
    const std::string dir = parent_of(path);
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) != 0) refuse(path, what, "directory '" + dir + "' does not exist");
    if (!S_ISDIR(ds.st_mode)) refuse(path, what, "'" + dir + "' is not a directory");
    return path;
  }
  if (S_ISREG(st.st_mode)) return path;
  if (!S_ISLNK(st.st_mode)) refuse(path, what, std::string("it is ") + kind_of(st.st_mode));
  // /dev/stdout, /dev/fd/N, /proc/self/fd/N: a process's stream, which resolves to a regular file
  // when the stream is redirected (`> log`); replacing it would replace that file.
  if (const std::string stream = stream_link(path); !stream.empty()) {
    refuse(path, what, "it is a link to a process's stream ('" + stream + "'), not a file");
  }
  // A symlink: the link stays, its final target is what gets replaced.
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    refuse(path, what, std::string("it is a symlink whose target cannot be resolved: ") + std::strerror(errno));
  }
  struct stat ts {};
  if (::stat(resolved, &ts) != 0) {
    refuse(path, what, std::string("it is a symlink to '") + resolved + "', which cannot be inspected: " +
                           std::strerror(errno));
  }
  if (!S_ISREG(ts.st_mode)) {
    refuse(path, what, std::string("it is a symlink to '") + resolved + "', which is " + kind_of(ts.st_mode));
  }
  return resolved;
}

AtomicOutput::AtomicOutput(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
  target_ = check_output_path(path_, what_);
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    temp_ = target_ + ".tmp." + unique_suffix();
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) {
    const int err = errno;
    const std::string tmp = temp_;
    temp_.clear();  // not ours: nothing to remove
    DSV41_FAIL("cannot write ", what_, " '", path_, "': cannot create '", tmp, "': ", std::strerror(err));
  }
  // A replaced file keeps its permission bits.
  struct stat st {};
  if (::stat(target_.c_str(), &st) == 0) ::fchmod(fd_, st.st_mode & 07777);
}

AtomicOutput::~AtomicOutput() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicOutput::fail(const std::string& why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  temp_.clear();
  DSV41_FAIL("cannot write ", what_, " '", path_, "': ", why);
}

void AtomicOutput::write(const void* data, size_t n) {
  DSV41_CHECK(fd_ >= 0 && !committed_, "'", path_, "': write after commit or failure");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::write(fd_, p + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("writing '" + temp_ + "' failed: " + std::strerror(k < 0 ? errno : EIO));
    done += static_cast<size_t>(k);
  }
}

void AtomicOutput::commit() {
  DSV41_CHECK(fd_ >= 0 && !committed_, "'", path_, "': committed twice or after a failure");
  if (::fsync(fd_) != 0) fail("fsync of '" + temp_ + "' failed: " + std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("closing '" + temp_ + "' failed: " + std::strerror(errno));
  // The target may have changed since the check: never rename over anything but a regular file.
  struct stat st {};
  if (::lstat(target_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    fail(std::string("'") + target_ + "' became " + kind_of(st.st_mode) + " while it was written; left as it is");
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    fail("cannot rename '" + temp_ + "' over '" + target_ + "': " + std::strerror(errno));
  }
  committed_ = true;
  sync_directory(parent_of(target_));  // the rename itself durable
  remove_stale_temps(target_);
}

void write_file_atomically(const std::string& path, const std::string& what, const void* data, size_t n) {
  AtomicOutput f(path, what);
  f.write(data, n);
  f.commit();
}

AtomicDirectory::AtomicDirectory(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
  target_ = path_;
  while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
  if (target_.empty()) refuse(path_, what_, "the path is empty");
  struct stat st {};
  if (::lstat(target_.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) refuse(path_, what_, std::string("it is ") + kind_of(st.st_mode) + ", not a directory");
    std::error_code ec;
    if (!std::filesystem::is_empty(target_, ec) || ec) refuse(path_, what_, "the directory is not empty");
  } else if (errno != ENOENT) {
    refuse(path_, what_, std::string("cannot inspect it: ") + std::strerror(errno));
  }
  const std::string parent = parent_of(target_);
  std::error_code ec;
  if (!std::filesystem::exists(parent, ec) && (!std::filesystem::create_directories(parent, ec) || ec)) {
    refuse(path_, what_, "cannot create the directory '" + parent + "': " + ec.message());
  }
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_ = target_ + ".tmp." + unique_suffix();
    if (::mkdir(temp_.c_str(), 0777) == 0) return;
    err = errno;
    if (err != EEXIST) break;
  }
  const std::string tmp = temp_;
  temp_.clear();  // not ours: nothing to remove
  DSV41_FAIL("cannot write ", what_, " '", path_, "': cannot create the directory '", tmp, "': ", std::strerror(err));
}

AtomicDirectory::~AtomicDirectory() {
  if (!committed_ && !temp_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_, ec);
  }
}

void AtomicDirectory::commit() {
  DSV41_CHECK(!committed_ && !temp_.empty(), "'", path_, "': committed twice");
  // The files' bytes are durable (each written by AtomicOutput, fsynced); the directory's entries too.
  sync_directory(temp_);
  // rename(2) replaces an empty directory atomically and refuses a non-empty one.
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    committed_ = true;  // the complete set stays where it is: nothing written is lost
    DSV41_FAIL("cannot write ", what_, " '", path_, "': cannot move the complete directory '", temp_,
               "' onto it: ", std::strerror(err),
               err == ENOTEMPTY || err == EEXIST ? " (something was written into it meanwhile); the files stay in '" + temp_ + "'"
                                                 : std::string("; the files stay in '") + temp_ + "'");
  }
  committed_ = true;
  sync_directory(parent_of(target_));
  remove_stale_temps(target_);
}

}  // namespace dsv41::output

// ---- outputs never alias inputs (VerbFiles) and tool-owned output directories ----
namespace dsv41::output {
namespace {

// What a path is on disk: an existing node (st_dev, st_ino, symlinks followed), or a new name in
// an existing directory (that directory's st_dev, st_ino and the name). known: false when neither.
struct Identity {
  bool known = false, exists = false, directory = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;  // a new path: its last component
};

Identity identity_of(std::string path) {
  Identity id;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.known = id.exists = true;
    id.directory = S_ISDIR(st.st_mode);
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    return id;
  }
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat ds {};
  if (::stat(parent_of(path).c_str(), &ds) != 0) return id;
  id.known = true;
  id.dev = ds.st_dev;
  id.ino = ds.st_ino;
  id.name = base_of(path);
  return id;
}

bool same(const Identity& a, const Identity& b) {
  return a.known && b.known && a.exists == b.exists && a.dev == b.dev && a.ino == b.ino && a.name == b.name;
}

// Whether the existing node `path` lies (at any depth) inside the directory `dir`.
bool inside(const std::string& path, const Identity& dir) {
  if (!dir.exists || !dir.directory) return false;
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) return false;
  std::string cur = resolved;
  while (cur != "/") {
    cur = parent_of(cur);
    struct stat st {};
    if (::stat(cur.c_str(), &st) != 0) return false;
    if (st.st_dev == dir.dev && st.st_ino == dir.ino) return true;
  }
  return false;
}

[[noreturn]] void refuse_alias(const std::string& out, const std::string& out_what, const std::string& how,
                               const std::string& in, const std::string& in_what, const std::string& why) {
  DSV41_FAIL("output '", out, "' (", out_what, ") ", how, " '", in, "' (", in_what, "): ", why,
             " (outputs never alias inputs; docs/cli.md, Output files)");
}

}  // namespace

VerbFiles& VerbFiles::input(const std::string& path, const std::string& what) {
  if (!path.empty()) inputs_.push_back({path, what, false, ""});
  return *this;
}

VerbFiles& VerbFiles::input_updated_by(const std::string& path, const std::string& what, const std::string& updated_by) {
  if (!path.empty()) inputs_.push_back({path, what, false, updated_by});
  return *this;
}

VerbFiles& VerbFiles::output(const std::string& path, const std::string& what) {
  if (!path.empty()) outputs_.push_back({path, what, false, ""});
  return *this;
}

VerbFiles& VerbFiles::output_directory(const std::string& path, const std::string& what) {
  if (!path.empty()) outputs_.push_back({path, what, true, ""});
  return *this;
}

void VerbFiles::check() const {
  std::vector<Identity> in_ids;
  for (const Entry& i : inputs_) in_ids.push_back(identity_of(i.path));
  std::vector<Identity> out_ids;
  for (const Entry& o : outputs_) out_ids.push_back(identity_of(o.path));
  for (size_t k = 0; k < outputs_.size(); ++k) {
    const Entry& o = outputs_[k];
    const Identity& oid = out_ids[k];
    for (size_t j = 0; j < inputs_.size(); ++j) {
      const Entry& i = inputs_[j];
      const Identity& iid = in_ids[j];
      if (!iid.exists) continue;  // its reader names it
      if (!i.updated_by.empty() && i.updated_by == o.path) continue;  // read whole, then replaced on purpose
      if (oid.exists && same(oid, iid)) {
        refuse_alias(o.path, o.what, "is the input", i.path, i.what, "refusing to replace an input");
      }
      if (oid.exists && !oid.directory && inside(o.path, iid)) {
        refuse_alias(o.path, o.what, "is a file of the input directory", i.path, i.what, "refusing to replace an input");
      }
      if (o.directory && inside(i.path, oid)) {
        refuse_alias(o.path, o.what, "holds the input", i.path, i.what, "refusing to write over an input");
      }
    }
    for (size_t j = 0; j < k; ++j) {
      if (same(oid, out_ids[j])) {
        refuse_alias(o.path, o.what, "is the same file as the output", outputs_[j].path, outputs_[j].what,
                     "refusing to write one output over another");
      }
    }
  }
}

void claim_output_directory(const std::string& path, const std::string& what, bool create) {
  if (path.empty()) refuse(path, what, "the path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) refuse(path, what, std::string("it is ") + kind_of(st.st_mode) + ", not a directory");
    std::error_code ec;
    if (!std::filesystem::is_empty(path, ec) || ec) {
      refuse(path, what,
             "the directory is not empty (the tool fills a new or empty directory with folders of its own and "
             "never removes what it did not create; give a new path)");
    }
    return;
  }
  if (errno != ENOENT) refuse(path, what, std::string("cannot inspect it: ") + std::strerror(errno));
  if (!create) return;
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) refuse(path, what, "cannot create it: " + ec.message());
}

}  // namespace dsv41::output
