// Issue 35, the input classes, end to end: `dsv41` on each bad input exits 2 within seconds and
// bounded memory, naming the thing and the reason (docs/errors.md "Input classes (issue 35)").
//   5  sizes checked before allocating: absurd config products, a machine too small, a dump step's
//      n_tokens past max_seq_len
//   6  unbounded reads: /dev/zero and oversized files as text inputs (base/input_file.h limits)
//   7  FIFOs where a regular file is required (opened with O_NONBLOCK, refused by fstat)
//   11 messages with the file: directories, JSON fields of the wrong type, an HDF5 dataset of 2^40
//      elements, a 150 MB safetensors header
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
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
constexpr double kMaxSeconds = 20.0;           // "within seconds" (each refusal takes well under 1 s)
constexpr long kMaxRssKiB = 1024 * 1024;       // "bounded memory": 1 GiB (the cases' inputs are 2^40 or 4 GB)

struct Measured {
  CliResult r;
  double seconds = 0;
  long max_rss_kib = 0;
};

// `dsv41 <args>` under `timeout -s KILL 120`, with its wall time and peak resident memory (wait4).
Measured measure(const std::string& args) {
  const std::string out = scratch() + "/stdout", err = scratch() + "/stderr";
  const std::string cmd = std::string("exec timeout -s KILL 120 '") + DSV41_EXE + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  Measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.max_rss_kib = ru.ru_maxrss;
  m.r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  m.r.out = read_bytes(out);
  m.r.err = read_bytes(err);
  return m;
}

void expect_refused(const std::string& what, const std::string& args, const std::string& message) {
  SCOPED_TRACE(what + ": dsv41 " + args);
  const Measured m = measure(args);
  EXPECT_EQ(m.r.code, 2) << m.r.out << m.r.err;
  EXPECT_TRUE(has(m.r.err, message)) << "want '" << message << "' in:\n" << m.r.err;
  EXPECT_FALSE(has(m.r.err, "unexpected failure")) << m.r.err;
  EXPECT_LT(m.seconds, kMaxSeconds);
  EXPECT_LT(m.max_rss_kib, kMaxRssKiB);
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string fifo(const std::string& name) {
  const std::string path = scratch() + "/" + name;
  fs::remove(path);
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
  return path;
}

// A sparse file of `bytes` bytes beginning with `head`.
std::string sparse(const std::string& name, const std::string& head, uint64_t bytes) {
  const std::string path = write_file(name, head);
  fs::resize_file(path, bytes);
  return path;
}

std::string fwd(const std::string& extra) {
  return "forward --config '" + kConfig + "' --weights '" + kWeights + "' " + extra + " -o '" + scratch() + "/f.h5'";
}

// A port dump of the oracle model (the directory form), written by `dsv41 forward --dump`.
std::string make_dump(const std::string& name) {
  const std::string dir = scratch() + "/" + name;
  fs::remove_all(dir);
  const CliResult r = run_dsv41("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2,3 --dump '" +
                                dir + "'");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return dir;
}

std::string conform_args(const std::string& dump, const std::string& extra = "") {
  return "conform '" + dump + "' --config '" + kConfig + "' --weights '" + kWeights + "' " + extra + " -o '" + scratch() +
         "/c.h5'";
}

// The oracle config with fields replaced.
std::string config_with(const std::string& name, const nlohmann::json& fields) {
  nlohmann::json c = nlohmann::json::parse(read_bytes(kConfig));
  for (const auto& [k, v] : fields.items()) c[k] = v;
  return write_file(name, c.dump());
}

TEST(InputClasses, SizesAreCheckedBeforeAllocating) {  // class 5
  std::vector<int> ratios = nlohmann::json::parse(read_bytes(kConfig))["compress_ratios"].get<std::vector<int>>();
  ratios.pop_back();
  ratios.resize(65537, 0);
  const std::string absurd = config_with("absurd.json", {{"n_layers", 65536}, {"n_routed_experts", 65536},
                                                         {"compress_ratios", ratios}});
  expect_refused("65536 layers x 65536 experts", "bytes --config '" + absurd + "'",
                 "config file '" + absurd + "': derived size: ");
  expect_refused("the same, replay-study", "replay-study --config '" + absurd + "'", "checkpoint tensors, more than the limit");
  expect_refused("engram_num_embeddings without an upper limit",
                 "bytes --config '" + config_with("engram.json", {{"engram_num_embeddings", {4064, int64_t{1} << 40}}}) + "'",
                 "field 'engram_num_embeddings': must be at most 4294967296, got 1099511627776");
  // Within every config limit (4.0 TiB of weights), but more than this machine has.
  const std::string big = config_with("big.json", {{"dim", 1024}, {"n_routed_experts", 4096}, {"moe_inter_dim", 65536}});
  expect_refused("huge dims in replay-study", "replay-study --config '" + big + "'",
                 "config '" + big + "': its weights (");
  expect_refused("the same: the machine named", "replay-study --config '" + big + "'", "more than this machine's physical memory");
  // A dump step's declared n_tokens: refused from the manifest, before positions are allocated.
  const std::string dump = make_dump("huge_tokens");
  for (const int64_t n : {int64_t{1} << 40, int64_t{300000000}}) {
    nlohmann::json m = nlohmann::json::parse(read_bytes(dump + "/dump.json"));
    m["steps"][0]["n_tokens"] = n;
    m["steps"][0]["kept"] = n;
    std::ofstream(dump + "/dump.json", std::ios::binary) << m.dump();
    expect_refused("a dump step of " + std::to_string(n) + " tokens", conform_args(dump),
                   "n_tokens " + std::to_string(n) + " at start_pos 0 reach past max_seq_len 512");
  }
}

TEST(InputClasses, TextInputsAreBounded) {  // class 6
  expect_refused("--config /dev/zero", "bytes --config /dev/zero",
                 "config file '/dev/zero': is a character device, not a regular file");
  expect_refused("--prompt @/dev/zero", fwd("--prompt @/dev/zero"), "--prompt file '/dev/zero': is a character device");
  expect_refused("--token-map /dev/zero", fwd("--prompt 1 --token-map /dev/zero"),
                 "--token-map file '/dev/zero': is a character device");
  const std::string dump = make_dump("zero");
  expect_refused("--tolerances /dev/zero", conform_args(dump, "--tolerances /dev/zero"),
                 "--tolerances file '/dev/zero': is a character device");
  fs::remove(dump + "/dump.json");
  fs::create_symlink("/dev/zero", dump + "/dump.json");
  expect_refused("dump.json -> /dev/zero", conform_args(dump), "port dump manifest '" + dump + "/dump.json': is a character device");
  const std::string vec = scratch() + "/vec";
  fs::create_directories(vec);
  fs::create_symlink("/dev/zero", vec + "/vectors.json");
  expect_refused("vectors.json -> /dev/zero", "conform --vectors '" + vec + "' --port-out '" + vec + "' -o '" + scratch() + "/v.h5'",
                 "vectors manifest '" + vec + "/vectors.json': is a character device");
  // Regular files past their kind's limit (sparse: nothing is written, a read would allocate).
  const std::string cfg = sparse("big_config.json", "{", uint64_t{4} << 30);
  expect_refused("a 4 GiB config", "bytes --config '" + cfg + "'",
                 "config file '" + cfg + "': 4294967296 bytes (4.0 GiB), over the limit of 16777216 bytes");
  const std::string ids = sparse("ids.txt", "1\n", uint64_t{300} << 20);
  expect_refused("a 300 MiB prompt file", fwd("--prompt @" + ids), "over the limit of 268435456 bytes (256.0 MiB) for a --prompt file");
}

TEST(InputClasses, FifosAreRefusedWithoutBlocking) {  // class 7
  expect_refused("--resume FIFO", fwd("--prompt 1 --resume '" + fifo("s.dsv41s") + "'"), "session file '" + scratch() +
                 "/s.dsv41s': is a FIFO, not a regular file");
  expect_refused("--weights FIFO", "forward --config '" + kConfig + "' --weights '" + fifo("w.safetensors") +
                 "' --prompt 1 -o '" + scratch() + "/f.h5'", "weights file '" + scratch() + "/w.safetensors': is a FIFO");
  expect_refused("--config FIFO", "bytes --config '" + fifo("c.json") + "'", "is a FIFO, not a regular file");
  expect_refused("--tolerances FIFO", conform_args(make_dump("tol"), "--tolerances '" + fifo("t.json") + "'"),
                 "--tolerances file '" + scratch() + "/t.json': is a FIFO");
  const std::string dump = make_dump("step_fifo");
  const std::string step = dump + "/step_000000.safetensors";
  fs::remove(step);
  ASSERT_EQ(::mkfifo(step.c_str(), 0600), 0);
  expect_refused("a dump's step file is a FIFO", conform_args(dump), "unreadable step file: weights file '" + step + "': is a FIFO");
  expect_refused("an HDF5 dump that is a FIFO", conform_args(fifo("d.h5")), "port dump '" + scratch() + "/d.h5': is a FIFO");
  expect_refused("a report that is a FIFO", "report show '" + fifo("r.h5") + "'", "HDF5 file '" + scratch() + "/r.h5': is a FIFO");
}

TEST(InputClasses, MessagesNameTheFileTheFieldAndTheReason) {  // class 11
  const std::string dump = make_dump("dirs");
  const std::string tol = scratch() + "/tol_dir";
  fs::create_directories(tol);
  expect_refused("--tolerances is a directory", conform_args(dump, "--tolerances '" + tol + "'"),
                 "--tolerances file '" + tol + "': is a directory, not a regular file");
  const std::string tol_type = write_file("tol_type.json", R"({"*": {"max_abs": "big"}})");
  const Measured t = measure(conform_args(dump, "--tolerances '" + tol_type + "'"));
  EXPECT_EQ(t.r.code, 2) << t.r.err;
  EXPECT_TRUE(has(t.r.err, "--tolerances '" + tol_type + "', key '*'")) << t.r.err;
  EXPECT_FALSE(has(t.r.err, "unexpected failure")) << t.r.err;
  fs::remove(dump + "/dump.json");
  fs::create_directories(dump + "/dump.json");
  expect_refused("dump.json is a directory", conform_args(dump), "port dump manifest '" + dump + "/dump.json': is a directory");
  // vectors.json with a field of the wrong type.
  const std::string vec = scratch() + "/vec_type";
  fs::create_directories(vec);
  std::ofstream(vec + "/vectors.json") << R"({"format": "dsv41 vectors", "version": 1, "tool": 5, "cases": []})";
  const Measured v = measure("conform --vectors '" + vec + "' --port-out '" + vec + "' -o '" + scratch() + "/v.h5'");
  EXPECT_EQ(v.r.code, 2) << v.r.err;
  EXPECT_FALSE(has(v.r.err, "unexpected failure")) << v.r.err;
  EXPECT_TRUE(has(v.r.err, vec + "/vectors.json: 'tool': type must be string, but is number")) << v.r.err;
  // A 150 MB safetensors header: the 100 MiB limit is the reason, not "does not fit the file".
  std::string head(8, '\0');
  const uint64_t n = 150000000;
  for (int i = 0; i < 8; ++i) head[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  const std::string st = sparse("big_header.safetensors", head, n + 16);
  expect_refused("a 150 MB safetensors header", "forward --config '" + kConfig + "' --weights '" + st + "' --prompt 1 -o '" +
                 scratch() + "/f.h5'", "header length 150000000 bytes (143.1 MiB), over the safetensors limit of 104857600");
  // An HDF5 dump with a chunked dataset of 2^40 elements (a few KB on disk).
  const std::string h5 = scratch() + "/huge.h5";
  ASSERT_EQ(run_dsv41("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2 --dump '" + h5 + "'").code, 0);
  {
    const hid_t f = H5Fopen(h5.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hsize_t dims[1] = {hsize_t{1} << 40}, chunk[1] = {1024};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    const hid_t ds = H5Dcreate2(f, "/step_000000/huge", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    const hid_t st_type = H5Tcopy(H5T_C_S1);
    H5Tset_size(st_type, 3);
    const hid_t as = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(ds, "dtype", st_type, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st_type, "F32");
    H5Aclose(a), H5Sclose(as), H5Tclose(st_type), H5Dclose(ds), H5Pclose(dcpl), H5Sclose(space), H5Fclose(f);
  }
  expect_refused("an HDF5 dump with a 2^40-element dataset", conform_args(h5),
                 "dataset '/step_000000/huge' (1099511627776 elements): needs 8796093022208 bytes");
}

}  // namespace
}  // namespace dsv41::test
