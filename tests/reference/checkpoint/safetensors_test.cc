// The safetensors reader and writer (reference/checkpoint/safetensors.h): every malformed file is a
// dsv41::Error naming the file, the tensor (where there is one) and the reason; write() then
// read() is the identity; write() is deterministic and atomic. The bad files are built byte by
// byte here, so each one breaks exactly one rule.
#include "reference/checkpoint/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"

namespace dsv41::reference::checkpoint::safetensors {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A path unique to this process and test (ctest runs tests side by side as separate processes).
std::string temp_path(const std::string& suffix) {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "/dsv41_safetensors_test_" + std::to_string(::getpid()) + "_" + t->name() + suffix;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file: 8-byte length, `header` as given, then `data_bytes` bytes of data (value 0x11).
std::string make_file(const std::string& header, size_t data_bytes) {
  const std::string path = temp_path(".safetensors");
  write_bytes(path, le64(header.size()) + header + std::string(data_bytes, '\x11'));
  return path;
}

// The message of the dsv41::Error that reading `path` throws ("(no error)" if none).
std::string read_error(const std::string& path) {
  try {
    SafetensorsFile::read(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The message names the file, the tensor (if given) and the reason.
void expect_error(const std::string& path, const std::string& tensor, const std::string& reason) {
  const std::string msg = read_error(path);
  EXPECT_TRUE(has(msg, "'" + path + "'")) << "file not named: " << msg;
  if (!tensor.empty()) {
    EXPECT_TRUE(has(msg, "tensor '" + tensor + "'")) << "tensor not named: " << msg;
  }
  EXPECT_TRUE(has(msg, reason)) << "reason '" << reason << "' missing: " << msg;
}

Entry make_entry(const std::string& name, DType dtype, std::vector<int64_t> shape, uint8_t first) {
  Entry t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<size_t>(dsv41::reference::stored_bytes(dtype, t.numel())));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(first + 37 * i);
  return t;
}

// One tensor of every dtype, plus a scalar and an empty tensor.
std::vector<Entry> every_dtype() {
  return {make_entry("f32", DType::kF32, {3, 5}, 1),       make_entry("bf16", DType::kBF16, {7}, 2),
          make_entry("e4m3", DType::kF8E4M3, {2, 3, 4}, 3), make_entry("e8m0", DType::kF8E8M0, {5}, 4),
          make_entry("f4", DType::kF4, {3, 6}, 5),          make_entry("i32", DType::kI32, {4}, 6),
          make_entry("i64", DType::kI64, {2, 2}, 7),        make_entry("scalar", DType::kF32, {}, 8),
          make_entry("empty", DType::kBF16, {0, 4}, 9)};
}

std::vector<std::string> leftovers(const std::string& dir, const std::string& stem) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stem, 0) == 0 && has(name, ".tmp")) out.push_back(name);
  }
  return out;
}

// Removes the files of the test that just ran (all named by temp_path).
class SafetensorsTest : public testing::Test {
 protected:
  void TearDown() override {
    const std::string prefix = std::filesystem::path(temp_path("")).filename().string();
    for (const auto& e : std::filesystem::directory_iterator(testing::TempDir())) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove_all(e.path());
    }
  }
};
class SafetensorsRead : public SafetensorsTest {};
class SafetensorsGet : public SafetensorsTest {};
class SafetensorsDecode : public SafetensorsTest {};
class SafetensorsWrite : public SafetensorsTest {};

// ---- malformed files ----

TEST_F(SafetensorsRead, MissingFile) {
  const std::string path = temp_path(".absent");
  std::filesystem::remove(path);
  expect_error(path, "", "cannot open");
}

TEST_F(SafetensorsRead, ShorterThanTheLength) {
  const std::string path = temp_path(".safetensors");
  write_bytes(path, std::string("\x05\x00\x00\x00\x00", 5));
  expect_error(path, "", "5 bytes: too short");
}

TEST_F(SafetensorsRead, HeaderLengthBeyondTheFile) {
  const std::string path = temp_path(".safetensors");
  write_bytes(path, le64(1000) + "{}");
  expect_error(path, "", "header length 1000 does not fit the file (10 bytes)");
}

TEST_F(SafetensorsRead, HeaderNotJson) {
  expect_error(make_file("{\"a\": {\"dtype\": ", 0), "", "header is not valid JSON");
}

TEST_F(SafetensorsRead, HeaderNotAnObject) {
  expect_error(make_file("[1, 2, 3]", 0), "", "header is not a JSON object");
}

TEST_F(SafetensorsRead, EntryNotAnObject) {
  expect_error(make_file(R"({"w": [1, 2]})", 0), "w", "entry is not an object");
}

TEST_F(SafetensorsRead, EntryWithoutDtype) {
  expect_error(make_file(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", 8), "w", "no 'dtype'");
}

TEST_F(SafetensorsRead, EntryWithoutShape) {
  expect_error(make_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", 8), "w", "no 'shape'");
}

TEST_F(SafetensorsRead, EntryWithoutDataOffsets) {
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [2]}})", 8), "w", "no 'data_offsets'");
}

TEST_F(SafetensorsRead, DataOffsetsNotAPair) {
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8), "w",
               "'data_offsets' must be [begin, end]");
}

TEST_F(SafetensorsRead, UnknownDtype) {
  expect_error(make_file(R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", 4), "w",
               "unsupported safetensors dtype 'F16'");
}

TEST_F(SafetensorsRead, NegativeShape) {
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", 8), "w",
               "must be non-negative integers");
}

TEST_F(SafetensorsRead, NegativeOffset) {
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", 8), "w",
               "data_offsets must be non-negative integers");
}

TEST_F(SafetensorsRead, TruncatedData) {
  // The entry claims 64 bytes; the data section has 32 (a copy cut short).
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}})", 32), "w",
               "data_offsets [0, 64] outside the data section of 32 bytes (truncated file?)");
}

TEST_F(SafetensorsRead, OffsetsReversed) {
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8), "w",
               "data_offsets [8, 4] outside the data section");
}

TEST_F(SafetensorsRead, ByteCountNotDtypeTimesShape) {
  expect_error(make_file(R"({"w": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 8]}})", 8), "w",
               "8 bytes stored, but BF16 [3, 2] needs 12");
}

TEST_F(SafetensorsRead, HugeShapeDoesNotOverflow) {
  // 2^32 x 2^32 elements would wrap a 64-bit count to 0 and match an empty byte range.
  expect_error(make_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
                         8),
               "w", "holds more than 2^62 elements");  // the shape limit (docs/cli.md "Limits") fires first
}

// An empty tensor whose other extents multiply past 2^62 (the regression input of a signed
// overflow UBSan caught in fuzz_safetensors: fuzz/corpus/fuzz_safetensors/
// regress_zero_extent_after_overflow).
TEST_F(SafetensorsRead, ZeroExtentAfterHugeExtentsIsRefusedAndNeverOverflows) {
  // The file: the product of the non-zero extents is over the 2^62 limit, so it is refused even
  // though the zero makes the tensor empty.
  expect_error(
      make_file(R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 0], "data_offsets": [0, 0]}})", 0),
      "w", "holds more than 2^62 elements");
  // Entry::numel itself stops at a zero extent instead of overflowing first (signed overflow:
  // caught by UBSan in fuzz_safetensors), and throws on a count that does not fit.
  const Entry z{"z", DType::kU8, {int64_t{1} << 40, int64_t{1} << 40, 0}, {}};
  EXPECT_EQ(z.numel(), 0);
  const Entry e{"big", DType::kU8, {int64_t{1} << 40, int64_t{1} << 40}, {}};
  EXPECT_THROW((void)e.numel(), Error);
}

TEST_F(SafetensorsRead, F4OddElementCount) {
  expect_error(make_file(R"({"w": {"dtype": "F4", "shape": [3, 3], "data_offsets": [0, 5]}})", 5), "w",
               "odd element count (9)");
}

TEST_F(SafetensorsRead, OverlappingTensors) {
  const std::string path = make_file(
      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
      R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
      24);
  expect_error(path, "", "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
}

TEST_F(SafetensorsRead, DuplicatedName) {
  const std::string path = make_file(
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
      R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
      8);
  expect_error(path, "", "header names 'a' twice");
}

TEST_F(SafetensorsRead, MetadataNotStrings) {
  expect_error(make_file(R"({"__metadata__": {"format": "pt", "seed": 7}})", 0), "",
               "__metadata__ value of 'seed' is not a string");
}

TEST_F(SafetensorsRead, MetadataNotAnObject) {
  expect_error(make_file(R"({"__metadata__": ["pt"]})", 0), "", "__metadata__ is not an object");
}

TEST_F(SafetensorsRead, DirectoryIsNotAFile) {
  const std::string path = temp_path(".dir");
  std::filesystem::create_directories(path);
  expect_error(path, "", "is a directory");
  std::filesystem::remove(path);
}

TEST_F(SafetensorsRead, GapsBetweenTensorsAreAllowed) {
  // Not required by the format: tensors with unused bytes between them, out of order.
  const std::string path = make_file(
      R"({"b": {"dtype": "BF16", "shape": [2], "data_offsets": [12, 16]},)"
      R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
      20);
  const SafetensorsFile f = SafetensorsFile::read(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.get("b").bytes, (std::vector<uint8_t>{0x11, 0x11, 0x11, 0x11}));
}

// ---- the checked accessor ----

TEST_F(SafetensorsGet, MismatchNamesTheTensorAndBothSides) {
  const std::string path = temp_path(".safetensors");
  write(path, {make_entry("w", DType::kBF16, {4, 2}, 0)}, {});
  const SafetensorsFile f = SafetensorsFile::read(path);
  const auto error_of = [&](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::string missing = error_of([&] { f.get("v"); });
  EXPECT_TRUE(has(missing, "'" + path + "'") && has(missing, "missing tensor 'v'")) << missing;
  const std::string dtype = error_of([&] { f.get("w", DType::kF32, {4, 2}); });
  EXPECT_TRUE(has(dtype, "tensor 'w' has dtype BF16, expected F32")) << dtype;
  const std::string shape = error_of([&] { f.get("w", DType::kBF16, {2, 4}); });
  EXPECT_TRUE(has(shape, "tensor 'w' has shape [4, 2], expected [2, 4]")) << shape;
  EXPECT_EQ(&f.get("w", DType::kBF16, {4, 2}), &f.get("w"));
}

// ---- decoding ----

TEST_F(SafetensorsDecode, ValuesOfEveryDtype) {
  const std::string path = make_file(
      R"({"f32": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
      R"( "bf16": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]},)"
      R"( "f4": {"dtype": "F4", "shape": [2, 2], "data_offsets": [8, 10]},)"
      R"( "e4m3": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [10, 12]},)"
      R"( "e8m0": {"dtype": "F8_E8M0", "shape": [2], "data_offsets": [12, 14]},)"
      R"( "i32": {"dtype": "I32", "shape": [1], "data_offsets": [16, 20]},)"
      R"( "i64": {"dtype": "I64", "shape": [1], "data_offsets": [24, 32]}})",
      0);
  // Replace the data: each value chosen so its decoding is known exactly.
  std::string bytes = read_bytes(path);
  const std::string data =
      std::string("\x00\x00\xc0\x3f", 4) +          // F32 1.5
      std::string("\x80\x3f\x00\xc0", 4) +          // BF16 1.0, -2.0
      std::string("\x21\xdf", 2) +                  // F4: element 2k in the low nibble: 0.5, 1, -6, -3
      std::string("\x38\xb8", 2) +                  // E4M3 1.0, -1.0
      std::string("\x7f\x80", 2) +                  // E8M0 1.0, 2.0
      std::string("\x00\x00", 2) +                  // gap
      std::string("\xfe\xff\xff\xff", 4) +          // I32 -2
      std::string(4, '\0') +                        // gap
      std::string("\x00\x00\x00\x01\x00\x00\x00\x00", 8);  // I64 2^24
  bytes += data;
  write_bytes(path, bytes);
  const SafetensorsFile f = SafetensorsFile::read(path);
  EXPECT_EQ(f.get("f32").to_f32(), (std::vector<float>{1.5f}));
  EXPECT_EQ(f.get("bf16").to_f32(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.get("f4").to_f32(), (std::vector<float>{0.5f, 1.0f, -6.0f, -3.0f}));
  EXPECT_EQ(f.get("e4m3").to_f32(), (std::vector<float>{1.0f, -1.0f}));
  EXPECT_EQ(f.get("e8m0").to_f32(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(f.get("i32").to_f32(), (std::vector<float>{-2.0f}));
  EXPECT_EQ(f.get("i64").to_f32(), (std::vector<float>{16777216.0f}));
}

// ---- the writer ----

TEST_F(SafetensorsWrite, RoundTripKeepsTensorsAndMetadata) {
  const std::string path = temp_path(".safetensors");
  const std::vector<Entry> tensors = every_dtype();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"seed", "7"}, {"note", "a \"quoted\" value"}};
  write(path, tensors, meta);
  const SafetensorsFile f = SafetensorsFile::read(path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.names().size(), tensors.size());
  size_t nonzero = 0;
  for (const Entry& t : tensors) {
    SCOPED_TRACE(t.name);
    const Entry& r = f.get(t.name);
    EXPECT_EQ(r.name, t.name);
    EXPECT_EQ(r.dtype, t.dtype);
    EXPECT_EQ(r.shape, t.shape);
    EXPECT_EQ(r.bytes, t.bytes);
    for (uint8_t b : r.bytes) nonzero += b != 0;
  }
  EXPECT_GT(nonzero, 0u);  // the comparison saw data, not only empty tensors
  // The header is padded to a multiple of 8 bytes (the data section starts aligned).
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST_F(SafetensorsWrite, DeterministicWhateverTheInputOrder) {
  std::vector<Entry> tensors = every_dtype();
  const std::map<std::string, std::string> meta = {{"b", "2"}, {"a", "1"}};
  const std::string first = temp_path(".1.safetensors"), second = temp_path(".2.safetensors");
  write(first, tensors, meta);
  std::reverse(tensors.begin(), tensors.end());
  write(second, tensors, meta);
  const std::string a = read_bytes(first), b = read_bytes(second);
  EXPECT_GT(a.size(), 8u);
  EXPECT_TRUE(a == b) << "the same tensors gave different files";
  // And again onto the same path: same bytes.
  write(first, tensors, meta);
  EXPECT_TRUE(read_bytes(first) == b);
}

TEST_F(SafetensorsWrite, AtomicLeavesNoTempFile) {
  const std::string path = temp_path(".safetensors");
  write(path, every_dtype(), {});
  const std::filesystem::path p(path);
  EXPECT_TRUE(leftovers(p.parent_path().string(), p.filename().string()).empty());
  // Overwriting replaces the file as a whole.
  write(path, {make_entry("only", DType::kI32, {2}, 1)}, {});
  EXPECT_EQ(SafetensorsFile::read(path).names(), (std::vector<std::string>{"only"}));
  EXPECT_TRUE(leftovers(p.parent_path().string(), p.filename().string()).empty());
}

TEST_F(SafetensorsWrite, FailedWriteThrowsAndLeavesNothing) {
  const std::string dir = temp_path(".no_such_dir");
  std::filesystem::remove_all(dir);
  const std::string path = dir + "/w.safetensors";
  std::string msg = "(no error)";
  try {
    write(path, every_dtype(), {});
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_TRUE(has(msg, "cannot write weights file '" + path + "'")) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(SafetensorsWrite, FailedWriteKeepsThePreviousFile) {
  // The target is a directory: the rename fails, the temp file goes, the directory stays.
  const std::string path = temp_path(".target_dir");
  std::filesystem::create_directories(path + "/inside");
  EXPECT_THROW(write(path, every_dtype(), {}), Error);
  EXPECT_TRUE(std::filesystem::is_directory(path + "/inside"));
  const std::filesystem::path p(path);
  EXPECT_TRUE(leftovers(p.parent_path().string(), p.filename().string()).empty());
  std::filesystem::remove_all(path);
}

TEST_F(SafetensorsWrite, RejectsInconsistentTensors) {
  const std::string path = temp_path(".safetensors");
  const auto error_of = [&](const std::vector<Entry>& ts) -> std::string {
    try {
      write(path, ts, {});
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  Entry short_bytes = make_entry("w", DType::kF32, {4}, 0);
  short_bytes.bytes.pop_back();
  const std::string a = error_of({short_bytes});
  EXPECT_TRUE(has(a, "'" + path + "'") && has(a, "tensor 'w'") && has(a, "15 bytes, but F32 [4] needs 16")) << a;
  const std::string b = error_of({make_entry("w", DType::kF32, {1}, 0), make_entry("w", DType::kF32, {1}, 0)});
  EXPECT_TRUE(has(b, "tensor 'w': name given twice")) << b;
  Entry odd = make_entry("q", DType::kF4, {2}, 0);
  odd.shape = {3};
  const std::string c = error_of({odd});
  EXPECT_TRUE(has(c, "tensor 'q'") && has(c, "odd element count")) << c;
  const std::string d = error_of({make_entry("__metadata__", DType::kF32, {1}, 0)});
  EXPECT_TRUE(has(d, "reserved")) << d;
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace dsv41::reference::checkpoint::safetensors
