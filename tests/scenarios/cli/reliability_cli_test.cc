// Issue 35, the output side (docs/errors.md "Classes"): each class of failure is refused with exit
// 2 (or the documented 3) naming the thing and the reason, and nothing is lost or replaced:
//  - a dump with no steps (conform crashed with SIGSEGV): exit 3, "holds no step";
//  - a failed HDF5 write (a full disk; here a file-size limit, SIGXFSZ ignored): exit 2, no
//    signal, the old file intact, no temp file left;
//  - tool-owned output folders are new or empty (selftest -o DIR emptied DIR/clean);
//  - outputs never alias inputs, nor each other, nor a process's stream (/dev/stdout);
//  - duplicate JSON keys, non-finite numbers, companions committed after a failure, terminal
//    escape codes in names.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/run_cli.h"

namespace dsv41::test {
namespace {

namespace fs = std::filesystem;
const std::string kOracle = DSV41_ORACLE_DIR;
const std::string kConfig = kOracle + "/config.json";
const std::string kWeights = kOracle + "/weights.safetensors";
const std::string kModel = "--config '" + kConfig + "' --weights '" + kWeights + "'";

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string copy_of(const std::string& from, const std::string& name) {
  const std::string to = scratch() + "/" + name;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  return to;
}

// No "<name>.tmp.*" left in the scratch directory.
std::vector<std::string> temp_files() {
  std::vector<std::string> left;
  for (const fs::directory_entry& e : fs::directory_iterator(scratch())) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) left.push_back(e.path().string());
  }
  return left;
}

// `dsv41 <args>` under a file-size limit of `blocks` 512-byte blocks (the soft limit; SIGXFSZ
// ignored, so a write past it fails with EFBIG as on a full disk). code: the exit status, -1 or
// 128+N when a signal ended dsv41.
CliResult run_limited(int blocks, const std::string& args) {
  const std::string out = scratch() + "/stdout", err = scratch() + "/stderr";
  const std::string cmd = "trap '' XFSZ; ulimit -S -f " + std::to_string(blocks) + "; '" + std::string(DSV41_EXE) + "' " +
                          args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

void expect_refused(const CliResult& r, int code, const std::string& message) {
  EXPECT_EQ(r.code, code) << r.out << r.err;
  EXPECT_TRUE(has(r.out + r.err, message)) << "want '" << message << "' in:\n" << r.out << r.err;
}

std::string forward_dump(const std::string& name) {
  const std::string dump = scratch() + "/" + name;
  const CliResult r = run_dsv41("forward " + kModel + " --prompt 1,2,3 --decode 4 -q --dump '" + dump + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  return dump;
}

// Class 1: a dump with no steps is no evidence: exit 3 (docs/conform.md "Coverage"), no crash.
TEST(ReliabilityOut, AnEmptyDumpIsInconclusiveNotACrash) {
  const std::string dump = forward_dump("d");
  nlohmann::json m = nlohmann::json::parse(read_bytes(dump + "/dump.json"));
  for (const nlohmann::json& s : m["steps"]) fs::remove(dump + "/" + s["file"].get<std::string>());
  m["steps"] = nlohmann::json::array();
  m["n_steps"] = 0;
  std::ofstream(dump + "/dump.json") << m.dump(1);
  const CliResult r = run_dsv41("conform '" + dump + "' " + kModel + " -q -o '" + scratch() + "/c.h5'");
  expect_refused(r, 3, "the dump holds no step");
}

// Class 2: a failed HDF5 write exits 2 with the message, no signal, the old file intact.
TEST(ReliabilityOut, AFailedHdf5WriteExitsTwoAndKeepsTheOldFile) {
  const std::string dump = forward_dump("d");
  const std::string out = write_file("out.h5", "the old file\n");
  const std::string s = write_file("s.json", R"({"name": "s", "events": [{"prompt": [1, 2, 3]}]})");
  for (const std::string& args : {"forward " + kModel + " --prompt 1,2,3,4,5,6,7,8 --decode 9 -q -o '" + out + "'",
                                  "run '" + s + "' --sides ref,ref -q -o '" + out + "'",
                                  "conform '" + dump + "' " + kModel + " -q -o '" + out + "'"}) {
    SCOPED_TRACE(args);
    const CliResult r = run_limited(8, args);  // 4 KiB per file
    expect_refused(r, 2, "failed (disk full or a file-size limit?)");
    EXPECT_EQ(read_bytes(out), "the old file\n");
    EXPECT_TRUE(temp_files().empty()) << temp_files().front();
  }
}

// Class 3: a tool-owned output folder is new or empty; nothing the user had there is removed.
TEST(ReliabilityOut, ToolOwnedOutputFoldersAreNewOrEmpty) {
  const std::string dir = scratch() + "/st";
  fs::create_directories(dir + "/clean");
  const std::string keep = write_file("st/clean/mine.txt", "mine\n");
  expect_refused(run_dsv41("selftest --ci -q -o '" + dir + "'"), 2, "selftest output directory (-o) '" + dir + "'");
  EXPECT_EQ(read_bytes(keep), "mine\n");
  const std::string v = scratch() + "/v";
  expect_refused(run_dsv41("vectors --sizes tiny -o '" + v + "' --reference-port '" + v + "'"), 2,
                 "is the same file as the output");
  EXPECT_FALSE(fs::exists(v));
}

// Class 4: outputs never alias inputs (nor each other, nor /dev/stdout).
TEST(ReliabilityOut, AnOutputNeverReplacesAnInput) {
  const std::string w = copy_of(kWeights, "w.safetensors"), c = copy_of(kConfig, "c.json");
  const std::string wb = read_bytes(w), cb = read_bytes(c);
  const std::string model = "--config '" + c + "' --weights '" + w + "'";
  const std::string prompt = write_file("p.txt", "1\n2\n3\n");
  const std::string s = write_file("s.json", R"({"name": "s", "events": [{"prompt": [1, 2, 3]}]})");
  const std::string h5dump = scratch() + "/d.h5";
  ASSERT_EQ(run_dsv41("forward " + kModel + " --prompt 1,2,3 -q --dump '" + h5dump + "'").code, 0);
  const std::string report = scratch() + "/r.h5";
  ASSERT_EQ(run_dsv41("run '" + s + "' --sides ref,ref -q -o '" + report + "'").code, 0);
  const std::string tol = write_file("tol.json", R"({"*": {"nmse": 1e-6, "origin": "stated"}})");
  fs::create_directories(scratch() + "/o");
  const std::string run_config = copy_of(kConfig, "o/config.json");
  const std::string base = copy_of(kConfig, "b.json");
  const std::string x = scratch() + "/x.h5";
  const std::string plan = write_file("plan.json", R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}]})");
  struct Case {
    std::string args, message;
  };
  for (const Case& k : std::vector<Case>{
           {"forward " + model + " --prompt 1,2 -q -o '" + w + "'", "(forward output (-o)) is the input '" + w + "' (weights (--weights))"},
           {"forward " + model + " --prompt 1,2 -q -o '" + c + "'", "is the input '" + c + "' (config (--config))"},
           {"forward " + model + " --prompt 1,2 -q -o '" + scratch() + "/f.h5' --save-state '" + w + "'",
            "(session file (--save-state)) is the input '" + w + "'"},
           {"forward " + model + " --prompt @'" + prompt + "' -q -o '" + prompt + "'", "(prompt file (--prompt @FILE))"},
           {"forward " + model + " --prompt 1,2 -q --dump '" + x + "' -o '" + x + "'", "is the same file as the output"},
           {"conform '" + h5dump + "' " + kModel + " -q -o '" + h5dump + "'", "is the input '" + h5dump + "' (port dump)"},
           {"conform '" + h5dump + "' " + kModel + " -q --tolerances '" + tol + "' --junit '" + tol + "'",
            "(JUnit file (--junit)) is the input '" + tol + "' (tolerance file (--tolerances))"},
           {"report junit '" + report + "' -o '" + report + "'", "(JUnit file (-o)) is the input '" + report + "' (report)"},
           {"run '" + s + "' --sides ref,ref -q -o '" + s + "'", "(report (-o)) is the input '" + s + "' (scenario)"},
           {"agree '" + scratch() + "/o' -q -o '" + run_config + "'", "is a file of the input directory"},
           {"sweep '" + plan + "' -q -o '" + plan + "'", "(report (-o)) is the input '" + plan + "' (sweep plan)"},
           {"layer-config --kind swa --base '" + base + "' -o '" + base + "'", "is the input '" + base + "' (base config (--base))"},
       }) {
    SCOPED_TRACE(k.args);
    expect_refused(run_dsv41(k.args), 2, k.message);
    EXPECT_TRUE(has(read_bytes(scratch() + "/stderr"), "refusing to")) << read_bytes(scratch() + "/stderr");
  }
  EXPECT_EQ(read_bytes(w), wb);
  EXPECT_EQ(read_bytes(c), cb);
  EXPECT_EQ(read_bytes(prompt), "1\n2\n3\n");
  EXPECT_TRUE(has(read_bytes(plan), "cold_prefill"));
  EXPECT_FALSE(fs::exists(x));
  // The one input an output may replace: a session advanced in place (--resume S --save-state S),
  // read whole before it is written. Any other output over it is refused.
  const std::string session = scratch() + "/s.dsv41s";
  ASSERT_EQ(run_dsv41("forward " + kModel + " --prompt 1,2,3 -q -o '" + scratch() + "/f1.h5' --save-state '" + session + "'").code, 0);
  const CliResult advanced = run_dsv41("forward " + kModel + " --resume '" + session + "' --prompt 4 -q -o '" + scratch() +
                                       "/f2.h5' --save-state '" + session + "'");
  EXPECT_EQ(advanced.code, 0) << advanced.err;
  EXPECT_TRUE(has(advanced.err, "saved the session at position 4")) << advanced.err;
  expect_refused(run_dsv41("forward " + kModel + " --resume '" + session + "' --prompt 5 -q -o '" + session + "'"), 2,
                 "is the input '" + session + "' (session file (--resume))");
  // /dev/stdout redirected to a file resolves to that file: refused (docs/cli.md "Output files").
  const CliResult r = run_dsv41("run '" + s + "' --sides ref,ref -q -o '" + scratch() + "/r2.h5' --junit /dev/stdout");
  expect_refused(r, 2, "it is a link to a process's stream");
}

// Class 10 (parts): duplicate keys, non-finite numbers, names with escape codes.
TEST(ReliabilityOut, DuplicateKeysNonFiniteNumbersAndEscapeCodesAreHandled) {
  const std::string dump = forward_dump("d");
  const std::string tol = write_file("tol.json", R"({"*": {"nmse": 1e-9, "origin": "stated"}, "*": {"nmse": 1, "origin": "stated"}})");
  expect_refused(run_dsv41("conform '" + dump + "' " + kModel + " -q --tolerances '" + tol + "' -o '" + scratch() + "/c.h5'"), 2,
                 "--tolerances '" + tol + "': key '*' appears twice in one object");
  const std::string dup = write_file("dup.json", R"({"name": "a", "name": "b", "events": [{"prompt": [1, 2]}]})");
  expect_refused(run_dsv41("run '" + dup + "' --sides ref,ref -q -o '" + scratch() + "/r.h5'"), 2, "key 'name' appears twice");
  const std::string plan = write_file("plan.json", R"({"scenarios": ["cold_prefill"], "models": [{"config": "tiny"}]})");
  for (const char* bad : {"nan", "inf", "-1", "0"}) {
    expect_refused(run_dsv41("sweep '" + plan + "' -q --item-timeout " + std::string(bad) + " -o '" + scratch() + "/s.h5'"), 2,
                   "--item-timeout");
  }
  // A scenario name with escape codes: printed escaped by run and report show.
  const std::string esc = write_file("esc.json", "{\"name\": \"red\\u001b[31mX\", \"events\": [{\"prompt\": [1, 2]}]}");
  const std::string report = scratch() + "/esc.h5";
  CliResult r = run_dsv41("run '" + esc + "' --sides ref,ref -q -o '" + report + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "red\\x1b[31mX")) << r.out;
  EXPECT_FALSE(has(r.out + r.err, "\x1b")) << "an escape code reached the terminal";
  r = run_dsv41("report show '" + report + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "red\\x1b[31mX")) << r.out;
  EXPECT_FALSE(has(r.out + r.err, "\x1b"));
}

// Class 10: a failed companion write (--save-state on a full disk) commits no output. The disk: a
// tmpfs in a user and mount namespace of its own (unshare -Urm), sized to hold the dump's step
// files but not the session file after them.
TEST(ReliabilityOut, AFailedCompanionWriteCommitsNoOutput) {
  if (std::system("unshare -Urm true >/dev/null 2>&1") != 0) GTEST_SKIP() << "no unprivileged mount namespace here";
  const std::string args = "forward " + kModel + " --prompt 1,2,3 -q --dump d --save-state s.dsv41s";
  const std::string probe = scratch() + "/probe";
  fs::create_directories(probe);
  ASSERT_EQ(std::system(("cd '" + probe + "' && '" + std::string(DSV41_EXE) + "' " + args + " 2>/dev/null").c_str()), 0);
  uintmax_t pages = 0;  // what the step files take on a tmpfs
  for (const fs::directory_entry& e : fs::directory_iterator(probe + "/d")) {
    if (e.path().extension() == ".safetensors") pages += (e.file_size() + 4095) / 4096;
  }
  const uintmax_t session = fs::file_size(probe + "/s.dsv41s");
  ASSERT_GT(session, 40u * 1024) << "the session file must not fit the margin";
  const std::string disk = scratch() + "/disk", listing = scratch() + "/listing", code = scratch() + "/code";
  fs::create_directories(disk);
  const std::string inner = "mount -t tmpfs -o size=" + std::to_string(pages * 4 + 40) + "k none '" + disk + "' && cd '" + disk +
                            "' && { '" + std::string(DSV41_EXE) + "' " + args + " >'" + scratch() + "/stdout' 2>'" + scratch() +
                            "/stderr'; echo \\$? >'" + code + "'; ls -A >'" + listing + "'; }";
  const std::string cmd = "unshare -Urm sh -c \"" + inner + "\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string err = read_bytes(scratch() + "/stderr");
  EXPECT_EQ(read_bytes(code), "2\n") << err;
  EXPECT_TRUE(has(err, "session file (--save-state)")) << err;
  EXPECT_TRUE(has(err, "No space left on device")) << err;
  EXPECT_EQ(read_bytes(listing), "") << "left on the full disk (the dump must not be published):\n" << read_bytes(listing);
}

}  // namespace
}  // namespace dsv41::test
