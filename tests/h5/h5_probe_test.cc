// h5/h5_probe.h: an HDF5 file from outside is read once in another process (the worker)
// before dsv41 reads it. A valid file passes; the crafted reports on which libhdf5 1.10.8 crashes, hangs or
// allocates 4 GB (fuzz/findings/) are refused with a reason naming the object, and reading them
// through the report reader throws dsv41::Error instead of killing the process; external links
// are refused; a corrupt chunk is found whether a dataset is read whole or in slabs (and only
// the sampled slabs above the full-read size); the deadline kills a worker that runs too long.
// The worker reads file after file; one that died (killed while idle or while reading, crashed,
// timed out) is replaced, and a crash of a worker that had read other files is confirmed by a
// new one. Corrupt variable-length string references are refused before libhdf5 follows them.
// The files are written here with the HDF5 C API.
#include "h5/h5_probe.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "reports/report.h"

namespace dsv41::h5 {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "dsv41_h5_probe_test." + std::to_string(::getpid()) + "." + name + ".h5";
}

// A file with what dsv41's readers read: attributes (string, integer), a variable-length string
// dataset, a compound table with a string and a number column, a float matrix.
std::string write_valid(const std::string& name) {
  const std::string path = temp_path(name);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  const hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  H5Tset_cset(str, H5T_CSET_UTF8);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const char* text = "dsv41";
  const hid_t a = H5Acreate2(f, "schema", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, str, &text);
  H5Aclose(a);
  const hsize_t n3[1] = {3};
  const hid_t s3 = H5Screate_simple(1, n3, nullptr);
  const char* names[3] = {"a", "bb", "ccc"};
  const hid_t ds = H5Dcreate2(f, "names", str, s3, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, str, H5S_ALL, H5S_ALL, H5P_DEFAULT, names);
  H5Dclose(ds);
  struct Row {
    const char* scenario;
    double value;
  };
  const hid_t row = H5Tcreate(H5T_COMPOUND, sizeof(Row));
  H5Tinsert(row, "scenario", HOFFSET(Row, scenario), str);
  H5Tinsert(row, "value", HOFFSET(Row, value), H5T_NATIVE_DOUBLE);
  const Row rows[3] = {{"x", 1.0}, {"y", 2.0}, {"z", 3.0}};
  const hid_t table = H5Dcreate2(f, "summary", row, s3, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(table, row, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows);
  H5Dclose(table);
  H5Tclose(row);
  const hsize_t mdims[2] = {8, 16};
  const hid_t ms = H5Screate_simple(2, mdims, nullptr);
  std::vector<float> m(8 * 16);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i) * 0.5f;
  const hid_t md = H5Dcreate2(f, "matrix", H5T_IEEE_F32LE, ms, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(md, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.data());
  H5Dclose(md);
  H5Sclose(ms);
  H5Sclose(s3);
  H5Sclose(scalar);
  H5Tclose(str);
  H5Fclose(f);
  return path;
}

// A [6, 5, 4] float dataset in gzip-compressed chunks of [1, 5, 4]; the chunk at index `bad`
// along the first dimension gets its stored bytes overwritten with garbage.
std::string write_corrupt_chunk(const std::string& name, hsize_t bad) {
  const std::string path = temp_path(name);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims[3] = {6, 5, 4}, chunk[3] = {1, 5, 4};
  const hid_t space = H5Screate_simple(3, dims, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 3, chunk);
  H5Pset_deflate(dcpl, 6);
  const hid_t d = H5Dcreate2(f, "chunked", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  std::vector<float> v(6 * 5 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7);
  H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  const hsize_t at[3] = {bad, 0, 0};
  haddr_t addr = 0;
  hsize_t bytes = 0;
  unsigned mask = 0;
  EXPECT_GE(H5Dget_chunk_info_by_coord(d, at, &mask, &addr, &bytes), 0);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  EXPECT_GT(bytes, 0u);
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(addr));
  const std::string garbage(static_cast<size_t>(bytes), '\xA5');
  io.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  return path;
}

TEST(H5Probe, ValidFileIsReadAndRemembered) {
  const std::string path = write_valid("valid");
  const ProbeResult r = probe_file(path);
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_TRUE(r.reason.empty());
  EXPECT_TRUE(probe_file(path).ok);
  // Slabs of one row (16 floats) instead of one whole read: the same verdict.
  ProbeLimits slabs;
  slabs.whole_read_bytes = 0;
  slabs.slab_bytes = 64;
  const ProbeResult rs = probe_file(path, slabs);
  EXPECT_TRUE(rs.ok) << rs.reason;
  std::remove(path.c_str());
}

TEST(H5Probe, MissingOrNonHdf5FilesAreLeftToTheCaller) {
  EXPECT_TRUE(probe_file("/nonexistent/dir/x.h5").ok);
  EXPECT_TRUE(probe_file("/nonexistent/dir/x.h5").opens);
  const std::string text = temp_path("text");
  std::ofstream(text) << "not hdf5\n";
  const ProbeResult r = probe_file(text);
  EXPECT_TRUE(r.ok);
  EXPECT_FALSE(r.opens);  // the caller says so without opening it
  EXPECT_TRUE(r.not_hdf5);
  // An HDF5 file cut after its superblock: HDF5, but libhdf5 cannot open it.
  const std::string valid = write_valid("cut");
  std::string head(512, '\0');
  std::ifstream(valid, std::ios::binary).read(head.data(), 512);
  const std::string cut = temp_path("cut_512");
  std::ofstream(cut, std::ios::binary).write(head.data(), 512);
  const ProbeResult rc = probe_file(cut);
  EXPECT_TRUE(rc.ok);
  EXPECT_FALSE(rc.opens);
  EXPECT_FALSE(rc.not_hdf5);
  try {
    (void)reports::read_report(cut, true);
    ADD_FAILURE() << "read_report accepted " << cut;
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open the HDF5 file (truncated or corrupt)"), std::string::npos)
        << e.what();
  }
  std::remove(text.c_str());
  std::remove(valid.c_str());
  std::remove(cut.c_str());
}

// The crafted reports of fuzz/findings/: before the probe, reading them segfaulted, looped or
// allocated 4 GB inside libhdf5; the last one crashed the caller's read after a clean probe (its
// heap collection's size grown by 16 bytes, found by the strict collection walk now; docs/errors.md,
// "Fuzzing").
TEST(H5Probe, CraftedReportsAreRefusedNotFatal) {
  for (const char* name : {"report_check_h5hg_4gb_malloc.h5", "report_check_h5hg_hang.h5",
                           "report_check_h5hg_read_segv.h5", "report_check_heap_index_segv.h5",
                           "report_read_gcol_size_segv.h5"}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(DSV41_SOURCE_DIR) + "/fuzz/findings/" + name;
    ASSERT_TRUE(std::ifstream(path).good()) << path;
    const ProbeResult r = probe_file(path);
    EXPECT_FALSE(r.ok);
    EXPECT_FALSE(r.reason.empty());
    try {
      (void)reports::read_report(path, true);
      ADD_FAILURE() << "read_report accepted " << path;
    } catch (const dsv41::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find("refused"), std::string::npos) << what;
    }
  }
}

TEST(H5Probe, ExternalLinkIsRefusedByName) {
  const std::string other = write_valid("other");
  const std::string path = temp_path("elink");
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(H5Gcreate2(f, "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_GE(H5Lcreate_external(other.c_str(), "/names", f, "meta/outside", H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
  const ProbeResult r = probe_file(path);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("link '/meta/outside'"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("external link"), std::string::npos) << r.reason;
  std::remove(path.c_str());
  std::remove(other.c_str());
}

TEST(H5Probe, CorruptChunkIsFoundWholeAndInSlabs) {
  const std::string path = write_corrupt_chunk("chunk", 3);  // a middle chunk
  const ProbeResult whole = probe_file(path);
  EXPECT_FALSE(whole.ok);
  EXPECT_NE(whole.reason.find("dataset '/chunked'"), std::string::npos) << whole.reason;
  ProbeLimits slabs;
  slabs.whole_read_bytes = 0;
  slabs.slab_bytes = 5 * 4 * 4;  // one chunk per slab
  const ProbeResult sliced = probe_file(path, slabs);
  EXPECT_FALSE(sliced.ok);
  EXPECT_NE(sliced.reason.find("dataset '/chunked'"), std::string::npos) << sliced.reason;
  // Slabs smaller than one index of the first dimension: split along the second.
  slabs.slab_bytes = 4 * 4;
  EXPECT_FALSE(probe_file(path, slabs).ok);
  // Above the full-read size only the first and the last slab are read: the middle chunk is not.
  slabs.slab_bytes = 5 * 4 * 4;
  slabs.full_read_bytes = 16;
  const ProbeResult sampled = probe_file(path, slabs);
  EXPECT_TRUE(sampled.ok) << sampled.reason;
  std::remove(path.c_str());
  // The first and the last chunk are read in the sampled mode.
  for (hsize_t bad : {hsize_t{0}, hsize_t{5}}) {
    const std::string edge = write_corrupt_chunk("edge" + std::to_string(bad), bad);
    EXPECT_FALSE(probe_file(edge, slabs).ok) << "chunk " << bad;
    std::remove(edge.c_str());
  }
}

TEST(H5Probe, DeadlineKillsTheWorker) {
  const std::string path = write_valid("deadline");
  ProbeLimits quick;
  quick.timeout_s = 1e-6;
  const ProbeResult r = probe_file(path, quick);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("did not finish"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("DSV41_H5_PROBE_TIMEOUT"), std::string::npos) << r.reason;
  EXPECT_EQ(probe_worker().pid, 0);  // killed and waited for
  // The next probe starts a new worker and reads the file in time.
  const ProbeWorker before = probe_worker();
  const ProbeResult again = probe_file(path, ProbeLimits{});
  EXPECT_TRUE(again.ok) << again.reason;
  EXPECT_EQ(probe_worker().started, before.started + 1);
  std::remove(path.c_str());
}

// One worker reads file after file, whatever their verdicts (a valid file, one that is not
// HDF5, a refused external link, a corrupt chunk): no process per file.
TEST(H5Probe, OneWorkerReadsFileAfterFile) {
  std::vector<std::string> files;
  for (int i = 0; i < 3; ++i) files.push_back(write_valid("many" + std::to_string(i)));
  const std::string text = temp_path("many_text");
  std::ofstream(text) << "not hdf5\n";
  const std::string chunk = write_corrupt_chunk("many_chunk", 2);
  ASSERT_TRUE(probe_file(files[0]).ok);
  const ProbeWorker first = probe_worker();
  ASSERT_GT(first.pid, 0);
  EXPECT_TRUE(probe_file(files[1]).ok);
  EXPECT_TRUE(probe_file(text).ok);
  EXPECT_FALSE(probe_file(chunk).ok);
  EXPECT_TRUE(probe_file(files[2]).ok);
  const ProbeWorker last = probe_worker();
  EXPECT_EQ(last.pid, first.pid);
  EXPECT_EQ(last.started, first.started);
  EXPECT_EQ(last.served, first.served + 4);
  // A file read before is remembered: no request at all; a refused one too, with its reason.
  EXPECT_TRUE(probe_file(files[1]).ok);
  EXPECT_EQ(probe_worker().served, last.served);
  const ProbeResult refused = probe_file(chunk);
  EXPECT_FALSE(refused.ok);
  EXPECT_NE(refused.reason.find("dataset '/chunked'"), std::string::npos) << refused.reason;
  EXPECT_EQ(probe_worker().served, last.served);
  // Changed, it is read again.
  std::ofstream(chunk, std::ios::app) << "more";
  (void)probe_file(chunk);
  EXPECT_EQ(probe_worker().served, last.served + 1);
  for (const std::string& f : files) std::remove(f.c_str());
  std::remove(text.c_str());
  std::remove(chunk.c_str());
}

// A worker killed from outside while it waits is replaced; the file is read by the new one and
// its verdict is the file's (not a crash).
TEST(H5Probe, WorkerKilledWhileIdleIsReplaced) {
  const std::string a = write_valid("idle_a"), b = write_valid("idle_b");
  ASSERT_TRUE(probe_file(a).ok);
  const ProbeWorker before = probe_worker();
  ASSERT_GT(before.pid, 0);
  ASSERT_EQ(::kill(static_cast<pid_t>(before.pid), SIGKILL), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const ProbeResult r = probe_file(b);
  EXPECT_TRUE(r.ok) << r.reason;
  const ProbeWorker after = probe_worker();
  EXPECT_NE(after.pid, before.pid);
  EXPECT_GT(after.pid, 0);
  EXPECT_EQ(after.started, before.started + 1);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// Overwrites 4 bytes (little-endian) at `offset` of the file.
void patch_u32(const std::string& path, uint64_t offset, uint32_t value) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(offset));
  const unsigned char b[4] = {static_cast<unsigned char>(value), static_cast<unsigned char>(value >> 8),
                              static_cast<unsigned char>(value >> 16), static_cast<unsigned char>(value >> 24)};
  io.write(reinterpret_cast<const char*>(b), 4);
}

// Where dataset `name` of a file keeps its data (contiguous).
uint64_t data_offset(const std::string& path, const char* name) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  const haddr_t at = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  EXPECT_NE(at, HADDR_UNDEF);
  return at;
}

// A stored variable-length string is its length (4 bytes), its heap collection's address (8) and
// its object's index (4). libhdf5 1.10.8 follows a corrupt index past the collection's object
// table, and copies an object longer than the stored length past the string's buffer: reads that
// crash or not depending on the memory there (a fuzzed report read cleanly in the worker and
// crashed the caller's process). The probe refuses both, and a collection outside the file,
// before libhdf5 follows them: in a string dataset and in a compound table's string column.
TEST(H5Probe, CorruptStringReferencesAreRefused) {
  struct Case {
    const char* dataset;
    uint64_t element_bytes, element, field;  // field: 0 length, 4 address, 12 index
    uint32_t value;
    const char* reason;
  };
  const Case cases[] = {
      {"names", 16, 1, 12, 300, "dataset '/names': a corrupt variable-length string, element 1: its heap object index is not in its collection"},
      {"names", 16, 2, 0, 7, "dataset '/names': a corrupt variable-length string, element 2: its length differs from its heap object's"},
      {"summary", 24, 2, 12, 0x00ffff00, "dataset '/summary': a corrupt variable-length string, element 2: its heap object index"},
      {"summary", 24, 0, 0, 1000, "dataset '/summary': a corrupt variable-length string, element 0: its length differs"},
      {"summary", 24, 1, 4, 0x7fffff00, "dataset '/summary': a corrupt variable-length string, element 1: its heap collection lies outside the file"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    const std::string path = write_valid("heapref" + std::to_string(i++));
    ASSERT_TRUE(probe_file(path, ProbeLimits{0, 64, 1 << 20, 10}).ok);  // sound before
    patch_u32(path, data_offset(path, c.dataset) + c.element * c.element_bytes + c.field, c.value);
    const ProbeResult r = probe_file(path);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.reason.find(c.reason), std::string::npos) << r.reason;
    std::remove(path.c_str());
  }
}

// A global heap collection ("GCOL", version, 3 reserved bytes, its size in 8 bytes, then objects:
// index 2, references 2, reserved 4, size 8, the bytes padded to 8; index 0 the free space)
// is walked to its end as libhdf5 1.10.8 walks it when it loads it. A size grown by 16 bytes past
// the free space (a fuzzed report: libhdf5 read the next 16 bytes as an object of any size, past
// its buffer, and crashed the caller after a clean probe) and a free space of size 0 (libhdf5
// loops) are refused before libhdf5 loads the collection.
TEST(H5Probe, CorruptHeapCollectionsAreRefused) {
  const auto read_file = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<unsigned char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const auto u64 = [](const std::vector<unsigned char>& b, size_t at) {
    uint64_t v = 0;
    for (size_t i = 8; i-- > 0;) v = (v << 8) | b[at + i];
    return v;
  };
  for (int c = 0; c < 2; ++c) {
    const std::string path = write_valid("gcol" + std::to_string(c));
    ASSERT_TRUE(probe_file(path, ProbeLimits{0, 64, 1 << 20, 10}).ok);  // sound before
    const std::vector<unsigned char> bytes = read_file(path);
    const std::string text(bytes.begin(), bytes.end());
    const size_t gcol = text.find("GCOL");
    ASSERT_NE(gcol, std::string::npos);
    const uint64_t size = u64(bytes, gcol + 8);
    if (c == 0) {
      patch_u32(path, gcol + 8, static_cast<uint32_t>(size + 16));
    } else {  // the free space's size (index 0) set to 0
      uint64_t p = 16;
      while (p + 16 <= size && (bytes[gcol + p] | bytes[gcol + p + 1]) != 0) p += 16 + (u64(bytes, gcol + p + 8) + 7) / 8 * 8;
      ASSERT_LE(p + 16, size) << "no free space object";
      patch_u32(path, gcol + p + 8, 0);
    }
    const ProbeResult r = probe_file(path);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.reason.find(c == 0 ? "an object of its heap collection overruns it"
                                   : "its heap collection's free space has size 0"),
              std::string::npos)
        << r.reason;
    std::remove(path.c_str());
  }
}

// A file that takes the worker seconds to read with `slow_limits()`: a [2^21, 16] float dataset in
// chunks never written (read as fill values; the file is small), read in slabs of one row: 2^21
// reads.
std::string write_slow(const std::string& name) {
  const std::string path = temp_path(name);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims[2] = {hsize_t{1} << 21, 16}, chunk[2] = {4096, 16};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  H5Dclose(H5Dcreate2(f, "slow", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  return path;
}
ProbeLimits slow_limits() {
  ProbeLimits lim;  // not the defaults, so never remembered: each probe is a request
  lim.whole_read_bytes = 0;
  lim.slab_bytes = 16 * 4;
  lim.timeout_s = 60;
  return lim;
}

// The worker keeps none of the caller's descriptors: a pipe the caller made before the worker
// started sees its end when the caller closes its write end.
TEST(H5Probe, WorkerKeepsNoDescriptorOfTheCaller) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);  // inheritable (no O_CLOEXEC)
  if (probe_worker().pid > 0) ::kill(static_cast<pid_t>(probe_worker().pid), SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const ProbeWorker before = probe_worker();
  const std::string path = write_valid("fds");
  ASSERT_TRUE(probe_file(path).ok);
  EXPECT_EQ(probe_worker().started, before.started + 1);  // forked while the pipe was open
  ::close(fds[1]);
  ASSERT_EQ(::fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  char c = 0;
  EXPECT_EQ(::read(fds[0], &c, 1), 0) << "a write end is still open somewhere (errno " << errno << ")";
  ::close(fds[0]);
  std::remove(path.c_str());
}

// A worker that dies while it reads a file (killed with SIGSEGV from outside, as libhdf5 crashing
// would end it): a fresh worker's death is the verdict, naming the signal and the object being
// read; a used worker's death is first checked by a fresh worker, whose verdict counts (here: the
// file is valid, so ok).
TEST(H5Probe, WorkerThatDiesWhileReadingIsReplaced) {
  const std::string slow = write_slow("slow");
  const std::string valid = write_valid("dies");
  // The first probe: a worker that reads until the deadline and is killed; the next is fresh.
  ProbeLimits quick = slow_limits();
  quick.timeout_s = 0.2;
  const ProbeResult late = probe_file(slow, quick);
  ASSERT_FALSE(late.ok);
  EXPECT_NE(late.reason.find("did not finish reading dataset '/slow'"), std::string::npos) << late.reason;
  const auto kill_worker_soon = [] {
    return std::thread([] {
      for (int i = 0; i < 400 && probe_worker().pid == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const long pid = probe_worker().pid;
      if (pid > 0) ::kill(static_cast<pid_t>(pid), SIGSEGV);
    });
  };
  const ProbeWorker s0 = probe_worker();
  std::thread killer = kill_worker_soon();
  const ProbeResult fresh = probe_file(slow, slow_limits());
  killer.join();
  EXPECT_FALSE(fresh.ok);
  EXPECT_NE(fresh.reason.find("libhdf5 crashed (signal 11, SIGSEGV) reading dataset '/slow'"), std::string::npos)
      << fresh.reason;
  EXPECT_EQ(probe_worker().pid, 0);
  EXPECT_EQ(probe_worker().started, s0.started + 1);
  // A used worker (it read `valid`) killed the same way: the file is read again by a new one.
  ASSERT_TRUE(probe_file(valid, slow_limits()).ok);
  const ProbeWorker s1 = probe_worker();
  killer = kill_worker_soon();
  const ProbeResult used = probe_file(slow, slow_limits());
  killer.join();
  EXPECT_TRUE(used.ok) << used.reason;
  EXPECT_EQ(probe_worker().started, s1.started + 1);
  EXPECT_EQ(probe_worker().served, s1.served + 1);  // the new worker's answer
  // That worker reads the next file.
  const ProbeWorker s2 = probe_worker();
  const ProbeResult after = probe_file(valid, slow_limits());
  EXPECT_TRUE(after.ok) << after.reason;
  EXPECT_EQ(probe_worker().pid, s2.pid);
  EXPECT_EQ(probe_worker().started, s1.started + 1);
  std::remove(slow.c_str());
  std::remove(valid.c_str());
}

// A relative path is read in the caller's working directory, also after it changed: the worker
// started in another directory is replaced.
TEST(H5Probe, RelativePathFollowsTheWorkingDirectory) {
  const std::string path = write_valid("relative");
  const std::string dir = path.substr(0, path.rfind('/'));
  const std::string name = path.substr(path.rfind('/') + 1);
  char old[4096];
  ASSERT_NE(::getcwd(old, sizeof old), nullptr);
  ASSERT_TRUE(probe_file(path).ok);  // a worker started here
  const ProbeWorker before = probe_worker();
  ASSERT_EQ(::chdir(dir.c_str()), 0);
  // A corrupt file under the same relative name would not be found from the old directory.
  ProbeLimits lim;
  lim.timeout_s = 10;
  const std::string chunk = write_corrupt_chunk("relative_chunk", 1);
  const std::string chunk_name = chunk.substr(chunk.rfind('/') + 1);
  const ProbeResult r = probe_file(chunk_name, lim);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("dataset '/chunked'"), std::string::npos) << r.reason;
  EXPECT_TRUE(probe_file(name, lim).ok);
  EXPECT_EQ(probe_worker().started, before.started + 1);
  ASSERT_EQ(::chdir(old), 0);
  std::remove(path.c_str());
  std::remove(chunk.c_str());
}

// A caller that holds files open (`dsv41 agree` reads the official runs while it probes them):
// a worker forked then shares libhdf5's state of those files, so it keeps their descriptors and
// reads one file only. Before that rule, the worker closed the descriptors and then could not
// read a file the caller held ("the links: HDF5 cannot list them"). Once the caller holds nothing,
// one worker reads file after file again.
TEST(H5Probe, CallerHoldingFilesGetsAOneFileWorker) {
  const std::string held = write_valid("held"), other = write_valid("held_other");
  const std::string later_a = write_valid("held_later_a"), later_b = write_valid("held_later_b");
  ASSERT_TRUE(probe_file(other).ok);  // a worker forked while this process holds nothing
  const ProbeWorker clean = probe_worker();
  ASSERT_GT(clean.pid, 0);
  ASSERT_EQ(::kill(static_cast<pid_t>(clean.pid), SIGKILL), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const hid_t f = H5Fopen(held.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const ProbeResult r = probe_file(held);
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(probe_worker().pid, 0) << "a worker that inherited open files reads one file";
  EXPECT_GT(probe_worker().started, clean.started);
  // The caller's file still reads after the worker has gone.
  hsize_t n = 0;
  EXPECT_GE(H5Fget_filesize(f, &n), 0);
  EXPECT_GT(n, 0u);
  const hid_t ds = H5Dopen2(f, "names", H5P_DEFAULT);
  EXPECT_GE(ds, 0);
  H5Dclose(ds);
  H5Fclose(f);
  ASSERT_TRUE(probe_file(later_a).ok);
  const ProbeWorker reused = probe_worker();
  ASSERT_GT(reused.pid, 0);
  ASSERT_TRUE(probe_file(later_b).ok);
  EXPECT_EQ(probe_worker().pid, reused.pid);
  for (const std::string& p : {held, other, later_a, later_b}) std::remove(p.c_str());
}

}  // namespace
}  // namespace dsv41::h5
