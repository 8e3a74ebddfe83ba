// h5/h5_io.h, the HDF5 layer golden/ and reports/ share: opening says why it cannot, a path
// exists only when every link on the way does, group members come sorted, type classes and
// dtype names match what HDF5 stores, C++ types map to HDF5's native types and back, and
// QuietErrors and Handle undo what they did. The fixture file is written here with the HDF5 C
// API, so the layer is tested against bytes it did not produce.
#include "h5/h5_io.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace dsv41::h5 {
namespace {

class H5Io : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One file per process: ctest runs each test of this suite as its own process, in parallel.
    path_ = ::testing::TempDir() + "dsv41_h5_io_test." + std::to_string(::getpid()) + ".h5";
    const hid_t f = H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5Gclose(H5Gcreate2(f, "grp", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    const hsize_t dims[2] = {2, 3};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    for (const char* name : {"grp/zeta", "grp/alpha", "grp/mid"}) {
      H5Dclose(H5Dcreate2(f, name, H5T_STD_U16LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    }
    H5Sclose(space);
    H5Fclose(f);
  }
  static void TearDownTestSuite() { std::remove(path_.c_str()); }

  static std::string path_;
};
std::string H5Io::path_;

TEST_F(H5Io, OpenReadOnlySaysWhyItCannot) {
  OpenFailure why = OpenFailure::kNone;
  EXPECT_LT(open_read_only("/nonexistent/dir/x.h5", &why), 0);
  EXPECT_EQ(why, OpenFailure::kNoFile);
  const std::string text = ::testing::TempDir() + "dsv41_h5_io_not_hdf5." + std::to_string(::getpid());
  std::ofstream(text) << "not an hdf5 file\n";
  EXPECT_LT(open_read_only(text, &why), 0);
  EXPECT_EQ(why, OpenFailure::kNotHdf5);
  std::remove(text.c_str());
  const Handle file(open_read_only(path_, &why), H5Fclose);
  EXPECT_TRUE(file.ok());
  EXPECT_EQ(why, OpenFailure::kNone);
}

TEST_F(H5Io, PathExistsOnlyWhenEveryLinkDoes) {
  OpenFailure why = OpenFailure::kNone;
  const Handle file(open_read_only(path_, &why), H5Fclose);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(path_exists(file.get(), "/"));
  EXPECT_TRUE(path_exists(file.get(), "grp"));
  EXPECT_TRUE(path_exists(file.get(), "grp/mid"));
  EXPECT_TRUE(path_exists(file.get(), "/grp/mid"));
  EXPECT_FALSE(path_exists(file.get(), ""));
  EXPECT_FALSE(path_exists(file.get(), "grp/none"));
  EXPECT_FALSE(path_exists(file.get(), "none/mid"));  // a missing group on the way: absent
}

TEST_F(H5Io, MemberNamesAreSorted) {
  OpenFailure why = OpenFailure::kNone;
  const Handle file(open_read_only(path_, &why), H5Fclose);
  const Handle group(H5Gopen2(file.get(), "grp", H5P_DEFAULT), H5Gclose);
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(member_names(group.get()), (std::vector<std::string>{"alpha", "mid", "zeta"}));
}

TEST_F(H5Io, StoredTypeAndShapeAreReadBack) {
  OpenFailure why = OpenFailure::kNone;
  const Handle file(open_read_only(path_, &why), H5Fclose);
  const Handle ds(H5Dopen2(file.get(), "grp/mid", H5P_DEFAULT), H5Dclose);
  const Handle type(H5Dget_type(ds.get()), H5Tclose);
  const Handle space(H5Dget_space(ds.get()), H5Sclose);
  EXPECT_EQ(type_of(type.get()), Type::kUInt);
  EXPECT_EQ(dtype_name(type_of(type.get()), H5Tget_size(type.get())), "uint16");
  EXPECT_EQ(space_dims(space.get()), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(space_count(space.get()), 6);
}

TEST(H5IoTypes, NativeTypesMapBothWays) {
  EXPECT_EQ(native_type<uint8_t>(), H5T_NATIVE_UINT8);
  EXPECT_EQ(native_type<uint16_t>(), H5T_NATIVE_UINT16);
  EXPECT_EQ(native_type<uint64_t>(), H5T_NATIVE_UINT64);
  EXPECT_EQ(native_type<int32_t>(), H5T_NATIVE_INT32);
  EXPECT_EQ(native_type<int64_t>(), H5T_NATIVE_INT64);
  EXPECT_EQ(native_type<float>(), H5T_NATIVE_FLOAT);
  EXPECT_EQ(native_type<double>(), H5T_NATIVE_DOUBLE);
  EXPECT_EQ(native_type(Type::kFloat, 2), -1);
  EXPECT_EQ(native_type(Type::kString, 8), -1);
  EXPECT_EQ(type_of(native_type<int32_t>()), type_class<int32_t>());
  EXPECT_EQ(type_of(native_type<uint64_t>()), type_class<uint64_t>());
  EXPECT_EQ(type_of(native_type<double>()), type_class<double>());
  EXPECT_EQ(dtype_name(type_class<float>(), sizeof(float)), "float32");
  EXPECT_EQ(dtype_name(type_class<int64_t>(), sizeof(int64_t)), "int64");
  EXPECT_EQ(dtype_name(Type::kString, 8), "a non-numeric type");
  const Handle s(vlen_utf8(), H5Tclose);
  EXPECT_EQ(type_of(s.get()), Type::kString);
  EXPECT_GT(H5Tis_variable_str(s.get()), 0);
  EXPECT_EQ(H5Tget_cset(s.get()), H5T_CSET_UTF8);
}

TEST(H5IoErrors, QuietErrorsRestoresThePrinterAndHandleCloses) {
  H5E_auto2_t before = nullptr;
  void* before_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &before, &before_data);
  ASSERT_NE(before, nullptr);  // HDF5 prints by default
  hid_t id = -1;
  {
    const QuietErrors quiet;
    H5E_auto2_t inside = before;
    void* inside_data = nullptr;
    H5Eget_auto2(H5E_DEFAULT, &inside, &inside_data);
    EXPECT_EQ(inside, nullptr);
    const Handle type(H5Tcopy(H5T_NATIVE_INT32), H5Tclose);
    id = type.get();
    EXPECT_GT(H5Iis_valid(id), 0);
  }
  EXPECT_LE(H5Iis_valid(id), 0);
  H5E_auto2_t after = nullptr;
  void* after_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &after, &after_data);
  EXPECT_EQ(after, before);
  EXPECT_EQ(after_data, before_data);
}

}  // namespace
}  // namespace dsv41::h5
