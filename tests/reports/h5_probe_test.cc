// reports/h5_probe.h: an HDF5 file from outside is read once in a child process before dsv41
// reads it. A valid file passes; the crafted reports on which libhdf5 1.10.8 crashes, hangs or
// allocates 4 GB (fuzz/findings/) are refused with a reason naming the object, and reading them
// through the report reader throws dsv41::Error instead of killing the process; external links
// are refused; a corrupt chunk is found whether a dataset is read whole or in slabs (and only
// the sampled slabs above the full-read size); the deadline kills a child that runs too long.
// The files are written here with the HDF5 C API.
#include "reports/h5_probe.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "formats/error.h"
#include "reports/report.h"

namespace dsv41::reports::h5 {
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
  const std::string text = temp_path("text");
  std::ofstream(text) << "not hdf5\n";
  EXPECT_TRUE(probe_file(text).ok);
  std::remove(text.c_str());
}

// The crafted reports of fuzz/findings/: before the probe, reading them segfaulted, looped or
// allocated 4 GB inside libhdf5 (docs/errors.md, "Fuzzing").
TEST(H5Probe, CraftedReportsAreRefusedNotFatal) {
  for (const char* name : {"report_check_h5hg_4gb_malloc.h5", "report_check_h5hg_hang.h5",
                           "report_check_h5hg_read_segv.h5"}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(DSV41_SOURCE_DIR) + "/fuzz/findings/" + name;
    ASSERT_TRUE(std::ifstream(path).good()) << path;
    const ProbeResult r = probe_file(path);
    EXPECT_FALSE(r.ok);
    EXPECT_FALSE(r.reason.empty());
    try {
      (void)read_report(path, true);
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

TEST(H5Probe, DeadlineKillsTheChild) {
  const std::string path = write_valid("deadline");
  ProbeLimits quick;
  quick.timeout_s = 1e-6;
  const ProbeResult r = probe_file(path, quick);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("did not finish"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("DSV41_H5_PROBE_TIMEOUT"), std::string::npos) << r.reason;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dsv41::reports::h5
