// The output-file policy (base/output_file.h, docs/cli.md "Output files"): a write goes only
// to a regular file or a new path; a FIFO, socket, directory or device is refused and left as it
// was; a symlink stays a link while its target is replaced; temp files are unique, removed on
// failure, and stale ones of dead writers are removed by the next write.
#include "base/output_file.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/error.h"

namespace {

namespace fs = std::filesystem;
using dsv41::output::AtomicDirectory;
using dsv41::output::AtomicOutput;
using dsv41::output::check_output_path;
using dsv41::output::write_file_atomically;

std::string dir() {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  const std::string d = testing::TempDir() + "/dsv41_out_" + std::to_string(::getpid()) + "_" + t->name();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void put(const std::string& path, const std::string& text) { write_file_atomically(path, "test file", text.data(), text.size()); }

std::string refusal(const std::string& path) {
  try {
    put(path, "new");
  } catch (const dsv41::Error& e) {
    return e.what();
  }
  return "";
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

// Entries of d other than `keep`.
std::vector<std::string> others(const std::string& d, const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) {
    const std::string name = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), name) == keep.end()) out.push_back(name);
  }
  return out;
}

TEST(OutputFile, NewAndRegularFilesAreWrittenAndReplaced) {
  const std::string d = dir();
  put(d + "/a.txt", "first");
  EXPECT_EQ(slurp(d + "/a.txt"), "first");
  ::chmod((d + "/a.txt").c_str(), 0600);
  put(d + "/a.txt", "second");
  EXPECT_EQ(slurp(d + "/a.txt"), "second");
  EXPECT_EQ(mode_of(d + "/a.txt") & 0777, 0600u) << "a replaced file keeps its permission bits";
  EXPECT_EQ(others(d, {"a.txt"}), std::vector<std::string>{}) << "no temp file left";
}

TEST(OutputFile, FifoIsRefusedAndStaysAFifo) {
  const std::string d = dir(), fifo = d + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string msg = refusal(fifo);
  EXPECT_NE(msg.find("cannot write test file '" + fifo + "': it is a FIFO"), std::string::npos) << msg;
  EXPECT_TRUE(S_ISFIFO(mode_of(fifo)));
  EXPECT_EQ(others(d, {"fifo"}), std::vector<std::string>{});
}

TEST(OutputFile, SocketIsRefusedAndStaysASocket) {
  const std::string d = dir(), sock = d + "/sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(addr.sun_path)) << "TempDir too deep for a socket path";
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string msg = refusal(sock);
  ::close(fd);
  EXPECT_NE(msg.find("it is a socket"), std::string::npos) << msg;
  EXPECT_TRUE(S_ISSOCK(mode_of(sock)));
}

TEST(OutputFile, DirectoryIsRefusedAndKept) {
  const std::string d = dir();
  fs::create_directories(d + "/sub");
  put(d + "/sub/inside", "x");
  EXPECT_NE(refusal(d + "/sub").find("it is a directory"), std::string::npos);
  EXPECT_NE(refusal(d + "/sub/").find("ends in '/'"), std::string::npos);
  EXPECT_EQ(slurp(d + "/sub/inside"), "x");
  EXPECT_NE(refusal(d + "/missing/x").find("directory '" + d + "/missing' does not exist"), std::string::npos);
}

// /dev/null is only inspected (check_output_path writes nothing), so even a broken check could
// not replace it; CI runs as root.
TEST(OutputFile, DevNullIsRefusedByTheCheck) {
  struct stat st {};
  if (::lstat("/dev/null", &st) != 0 || !S_ISCHR(st.st_mode)) GTEST_SKIP() << "no character device /dev/null";
  try {
    check_output_path("/dev/null", "test file");
    ADD_FAILURE() << "/dev/null accepted as an output";
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find("it is a character device"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(S_ISCHR(mode_of("/dev/null")));
}

TEST(OutputFile, SymlinkStaysALinkAndItsTargetIsReplaced) {
  const std::string d = dir();
  put(d + "/target", "old");
  fs::create_symlink("target", d + "/link");
  EXPECT_EQ(check_output_path(d + "/link", "test file"), fs::canonical(d + "/target").string());
  put(d + "/link", "new");
  EXPECT_TRUE(S_ISLNK(mode_of(d + "/link")));
  EXPECT_EQ(fs::read_symlink(d + "/link"), "target");
  EXPECT_EQ(slurp(d + "/target"), "new");
  EXPECT_EQ(others(d, {"target", "link"}), std::vector<std::string>{});
}

TEST(OutputFile, SymlinkToAFifoOrNowhereIsRefused) {
  const std::string d = dir();
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  fs::create_symlink("fifo", d + "/to_fifo");
  fs::create_symlink("absent", d + "/dangling");
  EXPECT_NE(refusal(d + "/to_fifo").find("which is a FIFO"), std::string::npos);
  EXPECT_NE(refusal(d + "/dangling").find("a symlink whose target cannot be resolved"), std::string::npos);
  EXPECT_TRUE(S_ISLNK(mode_of(d + "/to_fifo")));
  EXPECT_TRUE(S_ISLNK(mode_of(d + "/dangling")));
  EXPECT_TRUE(S_ISFIFO(mode_of(d + "/fifo")));
  EXPECT_FALSE(fs::exists(d + "/absent"));
}

TEST(OutputFile, ANodeThatAppearsWhileWritingIsNotReplaced) {
  const std::string d = dir(), path = d + "/late";
  AtomicOutput out(path, "test file");
  out.write("abc", 3);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);  // after the check, before the rename
  EXPECT_THROW(out.commit(), dsv41::Error);
  EXPECT_TRUE(S_ISFIFO(mode_of(path)));
  EXPECT_EQ(others(d, {"late"}), std::vector<std::string>{}) << "the temp file is removed";
}

TEST(OutputFile, WritersOfOnePathUseTheirOwnTempFiles) {
  const std::string d = dir(), path = d + "/shared";
  AtomicOutput a(path, "test file"), b(path, "test file");
  EXPECT_NE(a.temp_path(), b.temp_path());
  a.write("aaaa", 4);
  b.write("bb", 2);
  b.commit();
  a.commit();
  EXPECT_EQ(slurp(path), "aaaa");
  EXPECT_EQ(others(d, {"shared"}), std::vector<std::string>{});
}

TEST(OutputFile, AnUncommittedWriteLeavesTheOldFileAndNoTemp) {
  const std::string d = dir(), path = d + "/kept";
  put(path, "old");
  {
    AtomicOutput out(path, "test file");
    out.write("half", 4);
  }
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(others(d, {"kept"}), std::vector<std::string>{});
}

TEST(OutputFile, StaleTempsOfDeadWritersAreRemovedByTheNextWrite) {
  const std::string d = dir(), path = d + "/out";
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // a pid that no longer runs
  const std::string dead = "out.tmp." + std::to_string(child) + ".0.1";
  const std::string old_style = "out.tmp." + std::to_string(child);
  const std::string live = "out.tmp." + std::to_string(::getppid()) + ".0.1";  // a running process
  const std::string other = "other.tmp." + std::to_string(child) + ".0.1";     // another output's
  for (const std::string& n : {dead, old_style, live, other}) std::ofstream(d + "/" + n) << "partial";
  put(path, "done");
  std::vector<std::string> left = others(d, {"out"});
  std::sort(left.begin(), left.end());
  std::vector<std::string> want = {live, other};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(left, want);
}

// A directory written as one: absent until commit(), then every file at once; not committed, no
// trace; a non-empty directory or a file at the path refused and kept; an empty directory
// replaced; a dead writer's temp directory (kill -9) removed by the next commit.
TEST(OutputDirectory, AbsentUntilCommitThenComplete) {
  const std::string d = dir(), target = d + "/set";
  {
    AtomicDirectory out(target, "test set");
    put(out.temp_path() + "/a", "1");
    put(out.temp_path() + "/b", "2");
    EXPECT_FALSE(fs::exists(target));
    out.commit();
  }
  EXPECT_EQ(slurp(target + "/a"), "1");
  EXPECT_EQ(slurp(target + "/b"), "2");
  EXPECT_EQ(others(d, {"set"}), std::vector<std::string>{});
}

TEST(OutputDirectory, UncommittedLeavesNothing) {
  const std::string d = dir(), target = d + "/set";
  {
    AtomicDirectory out(target, "test set");
    put(out.temp_path() + "/a", "1");
  }
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(others(d, {}), std::vector<std::string>{});
}

TEST(OutputDirectory, EmptyDirectoryIsReplacedOthersAreRefusedAndKept) {
  const std::string d = dir();
  fs::create_directories(d + "/empty");
  {
    AtomicDirectory out(d + "/empty/", "test set");  // a trailing slash names the same directory
    put(out.temp_path() + "/a", "1");
    out.commit();
  }
  EXPECT_EQ(slurp(d + "/empty/a"), "1");
  fs::create_directories(d + "/full");
  put(d + "/full/keep", "k");
  put(d + "/file", "f");
  for (const std::string& p : {d + "/full", d + "/file"}) {
    try {
      AtomicDirectory out(p, "test set");
      ADD_FAILURE() << p << " was accepted";
    } catch (const dsv41::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(slurp(d + "/full/keep"), "k");
  EXPECT_EQ(slurp(d + "/file"), "f");
}

TEST(OutputDirectory, StaleTempDirectoryOfADeadWriterIsRemoved) {
  const std::string d = dir();
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string dead = d + "/set.tmp." + std::to_string(child) + ".0.1";
  fs::create_directories(dead);
  put(dead + "/partial", "p");
  AtomicDirectory out(d + "/set", "test set");
  put(out.temp_path() + "/a", "1");
  out.commit();
  EXPECT_EQ(others(d, {"set"}), std::vector<std::string>{});
}

// ---- outputs never alias inputs (VerbFiles), streams, tool-owned folders (issue 35) ----

std::string alias_refusal(const dsv41::output::VerbFiles& io) {
  try {
    io.check();
  } catch (const dsv41::Error& e) {
    return e.what();
  }
  return "";
}

TEST(VerbFiles, AnOutputThatIsAnInputIsRefusedThroughSymlinksToo) {
  const std::string d = dir();
  std::ofstream(d + "/w.bin") << "weights";
  fs::create_symlink(d + "/w.bin", d + "/link.bin");
  dsv41::output::VerbFiles io;
  io.input(d + "/w.bin", "weights (--weights)").output(d + "/link.bin", "report (-o)");
  const std::string e = alias_refusal(io);
  EXPECT_NE(e.find("output '" + d + "/link.bin' (report (-o)) is the input '" + d + "/w.bin' (weights (--weights))"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("refusing to replace an input"), std::string::npos) << e;
  EXPECT_EQ(slurp(d + "/w.bin"), "weights");
  dsv41::output::VerbFiles fine;
  fine.input(d + "/w.bin", "weights").output(d + "/other.h5", "report").input("", "not given").output("", "not given");
  EXPECT_EQ(alias_refusal(fine), "");
}

TEST(VerbFiles, TwoOutputsNamingOneNewFileAreRefused) {
  const std::string d = dir();
  dsv41::output::VerbFiles io;
  io.output(d + "/x.h5", "report (-o)").output_directory(d + "/./x.h5", "port dump (--dump)");
  EXPECT_NE(alias_refusal(io).find("is the same file as the output '" + d + "/x.h5'"), std::string::npos) << alias_refusal(io);
  dsv41::output::VerbFiles two;
  two.output(d + "/x.h5", "report").output(d + "/y.h5", "junit");
  EXPECT_EQ(alias_refusal(two), "");
}

TEST(VerbFiles, InputFoldersAndOutputFolders) {
  const std::string d = dir();
  fs::create_directories(d + "/run/sub");
  std::ofstream(d + "/run/sub/config.json") << "{}";
  dsv41::output::VerbFiles replaces;
  replaces.input(d + "/run", "official run folder").output(d + "/run/sub/config.json", "report (-o)");
  EXPECT_NE(alias_refusal(replaces).find("is a file of the input directory '" + d + "/run'"), std::string::npos)
      << alias_refusal(replaces);
  dsv41::output::VerbFiles beside;  // a new file inside an input folder replaces nothing
  beside.input(d + "/run", "official run folder").output(d + "/run/new.h5", "report (-o)");
  EXPECT_EQ(alias_refusal(beside), "");
  dsv41::output::VerbFiles holds;
  holds.input(d + "/run/sub/config.json", "config").output_directory(d + "/run", "port dump (--dump)");
  EXPECT_NE(alias_refusal(holds).find("holds the input"), std::string::npos) << alias_refusal(holds);
}

TEST(VerbFiles, AnInputUpdatedInPlaceByItsOneOutput) {
  const std::string d = dir();
  std::ofstream(d + "/s.dsv41s") << "session";
  dsv41::output::VerbFiles io;
  io.input_updated_by(d + "/s.dsv41s", "session file (--resume)", d + "/s.dsv41s").output(d + "/s.dsv41s", "session file (--save-state)");
  EXPECT_EQ(alias_refusal(io), "");
  dsv41::output::VerbFiles other;  // any other output over it
  other.input_updated_by(d + "/s.dsv41s", "session file (--resume)", d + "/t.dsv41s").output(d + "/s.dsv41s", "report (-o)");
  EXPECT_NE(alias_refusal(other).find("(report (-o)) is the input"), std::string::npos) << alias_refusal(other);
}

TEST(OutputPolicy, AStreamLinkIsRefusedEvenWhenItResolvesToAFile) {
  // /dev/stdout resolves to whatever stdout is; under ctest that may well be a regular file.
  for (const char* p : {"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"}) {
    const std::string e = refusal(p);
    EXPECT_NE(e.find("a link to a process's stream"), std::string::npos) << p << ": " << e;
  }
}

TEST(OutputPolicy, ToolOwnedFoldersAreNewOrEmpty) {
  const std::string d = dir();
  dsv41::output::claim_output_directory(d + "/new/deep", "selftest output directory (-o)");
  EXPECT_TRUE(fs::is_directory(d + "/new/deep"));
  dsv41::output::claim_output_directory(d + "/new/deep", "selftest output directory (-o)");  // empty: fine
  std::ofstream(d + "/new/deep/mine.txt") << "mine";
  try {
    dsv41::output::claim_output_directory(d + "/new/deep", "selftest output directory (-o)");
    ADD_FAILURE() << "a non-empty folder was claimed";
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the directory is not empty"), std::string::npos) << e.what();
  }
  dsv41::output::claim_output_directory(d + "/later", "x", /*create=*/false);
  EXPECT_FALSE(fs::exists(d + "/later"));
  EXPECT_EQ(slurp(d + "/new/deep/mine.txt"), "mine");
}

}  // namespace
