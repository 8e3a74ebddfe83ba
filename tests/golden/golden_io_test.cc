// golden/golden_io.h: reads every supported element type with its shape, and names the file and
// the dataset in every error (missing file, not HDF5, missing dataset, not a dataset, wrong type,
// wrong rank). The fixture file is written here with the HDF5 C API, so the reader is tested
// against bytes it did not produce.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "golden/golden_io.h"
#include "tests/support/error_of.h"

namespace dsv41::golden {
namespace {

using ::testing::HasSubstr;
using test::error_of;

template <typename T>
void write(hid_t file, const char* name, hid_t type, const std::vector<hsize_t>& dims,
           const std::vector<T>& values) {
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0) << name;
  ASSERT_GE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0) << name;
  H5Dclose(ds);
  H5Sclose(space);
}

class GoldenIo : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One file per process: ctest runs each test of this suite as its own process, in parallel.
    path_ = ::testing::TempDir() + "dsv41_golden_io_test." + std::to_string(::getpid()) + ".h5";
    const hid_t f = H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5Gclose(H5Gcreate2(f, "grp", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    write<uint8_t>(f, "grp/u8", H5T_NATIVE_UINT8, {2, 3}, {1, 2, 3, 4, 5, 255});
    write<uint16_t>(f, "grp/u16", H5T_NATIVE_UINT16, {4}, {0x0000, 0x7F80, 0xFFFF, 0x3F80});
    write<int32_t>(f, "i32", H5T_NATIVE_INT32, {1, 2}, {-7, 2147483647});
    write<int64_t>(f, "i64", H5T_NATIVE_INT64, {3}, {-1, 0, int64_t{1} << 40});
    write<float>(f, "f32", H5T_NATIVE_FLOAT, {2, 1, 2}, {1.5f, -0.0f, 3e38f, 1e-45f});
    write<double>(f, "f64", H5T_NATIVE_DOUBLE, {1}, {2.0});
    H5Fclose(f);
  }
  static void TearDownTestSuite() { std::remove(path_.c_str()); }

  static std::string path_;
};
std::string GoldenIo::path_;

TEST_F(GoldenIo, ReadsEveryTypeWithItsShape) {
  const H5File f(path_);
  const Array<uint8_t> u8 = f.read<uint8_t>("grp/u8", 2);
  EXPECT_EQ(u8.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(u8.data, (std::vector<uint8_t>{1, 2, 3, 4, 5, 255}));
  EXPECT_EQ(u8.at(1, 2), 255);
  EXPECT_EQ(f.read<uint16_t>("grp/u16").data, (std::vector<uint16_t>{0, 0x7F80, 0xFFFF, 0x3F80}));
  EXPECT_EQ(f.read<int32_t>("i32").data, (std::vector<int32_t>{-7, 2147483647}));
  EXPECT_EQ(f.read<int64_t>("i64", 1).data, (std::vector<int64_t>{-1, 0, int64_t{1} << 40}));
  const Array<float> f32 = f.read<float>("f32", 3);
  EXPECT_EQ(f32.shape, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(f32.data, (std::vector<float>{1.5f, -0.0f, 3e38f, 1e-45f}));
  EXPECT_TRUE(std::signbit(f32.data[1]));
}

TEST_F(GoldenIo, ListsGroupsAndChecksPaths) {
  const H5File f(path_);
  EXPECT_EQ(f.children("grp"), (std::vector<std::string>{"u16", "u8"}));
  EXPECT_EQ(f.children("/"), (std::vector<std::string>{"f32", "f64", "grp", "i32", "i64"}));
  EXPECT_TRUE(f.has("grp/u8"));
  EXPECT_FALSE(f.has("grp/none"));
  EXPECT_FALSE(f.has("none/u8"));  // a missing intermediate group is "absent", not an error
  EXPECT_THAT(error_of([&] { f.children("nogroup"); }), HasSubstr("group 'nogroup' not found"));
}

TEST_F(GoldenIo, ErrorsNameFileAndDataset) {
  EXPECT_THAT(error_of([] { H5File("/nonexistent/dir/x.h5"); }),
              HasSubstr("golden file not found: /nonexistent/dir/x.h5"));
  const std::string text = ::testing::TempDir() + "dsv41_golden_io_not_hdf5.h5";
  std::ofstream(text) << "not an hdf5 file\n";
  EXPECT_THAT(error_of([&] { H5File{text}; }), HasSubstr("not an HDF5 file: " + text));

  const H5File f(path_);
  const std::string missing = error_of([&] { f.read<uint8_t>("grp/missing"); });
  EXPECT_THAT(missing, HasSubstr(path_));
  EXPECT_THAT(missing, HasSubstr("dataset 'grp/missing' not found"));
  EXPECT_THAT(error_of([&] { f.read<uint8_t>("grp"); }), HasSubstr("'grp' is not a dataset"));
  const std::string type = error_of([&] { f.read<uint8_t>("grp/u16"); });
  EXPECT_THAT(type, HasSubstr(path_));
  EXPECT_THAT(type, HasSubstr("dataset 'grp/u16' holds uint16, expected uint8"));
  EXPECT_THAT(error_of([&] { f.read<int32_t>("grp/u8"); }), HasSubstr("holds uint8, expected int32"));
  EXPECT_THAT(error_of([&] { f.read<uint16_t>("i32"); }), HasSubstr("holds int32, expected uint16"));
  EXPECT_THAT(error_of([&] { f.read<float>("f64"); }), HasSubstr("holds float64, expected float32"));
  EXPECT_THAT(error_of([&] { f.read<int64_t>("f64"); }), HasSubstr("holds float64, expected int64"));
  const std::string rank = error_of([&] { f.read<uint8_t>("grp/u8", 1); });
  EXPECT_THAT(rank, HasSubstr(path_));
  EXPECT_THAT(rank, HasSubstr("dataset 'grp/u8' has rank 2, expected 1"));
}

}  // namespace
}  // namespace dsv41::golden
