// `dsv41 selfcheck`: a fast self-check of the storage formats, for a fresh build or machine.
//
// Checks: every E2M1 / E4M3 / E8M0 code decodes and re-encodes to itself (NaN codes to the
// format's NaN policy code); the published golden vectors of research/numerics.md section 10
// (values written here from the document, not produced by this code); the packed entry sizes
// 288 / 68 / 528; pack/unpack of seeded random rows against the block quantizers of
// formats/qdq.h, read back through the documented byte layout, within the format's error bound.
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "formats/qdq.h"
#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {
namespace {

using namespace dsv41::formats;

// Accumulates the first few mismatches of one check; an empty report is a pass.
class Report {
 public:
  template <typename... Args>
  void expect(bool ok, Args&&... what) {
    if (ok) return;
    if (++failures_ <= 3) {
      std::ostringstream os;
      (os << ... << what);
      text_ += (text_.empty() ? "" : "; ") + os.str();
    }
  }
  std::string str() const {
    return failures_ <= 3 ? text_ : text_ + "; ... (" + std::to_string(failures_) + " in all)";
  }

 private:
  int failures_ = 0;
  std::string text_;
};

std::string hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

std::string minifloat_round_trips() {
  Report r;
  for (uint32_t c = 0; c < 16; ++c) {
    r.expect(e2m1_encode(e2m1_decode(c)) == c, "E2M1 ", hex(c));
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t want = E4M3::is_nan(c) ? E4M3::kNanCode : c;  // NaN sign is dropped
    r.expect(e4m3_encode_satfinite(e4m3_decode(c)) == want, "E4M3 ", hex(c));
    r.expect(e8m0_encode_ceil(e8m0_decode(c)) == c, "E8M0 ", hex(c));
  }
  return r.str();
}

std::string e2m1_golden() {
  struct Case { float x; uint32_t code; };
  const Case cases[] = {{0.25f, 0x0},      {0.2500001f, 0x1}, {0.75f, 0x2}, {1.25f, 0x2},
                        {1.75f, 0x4},      {2.5f, 0x4},       {3.5f, 0x6},  {5.0f, 0x6},
                        {5.0000005f, 0x7}, {6.0f, 0x7},       {7.0f, 0x7},  {-0.1f, 0x8},
                        {-0.0f, 0x8},      {INFINITY, 0x7}};
  Report r;
  for (const Case& k : cases) {
    r.expect(e2m1_encode(k.x) == k.code, "E2M1(", k.x, ") = ", hex(e2m1_encode(k.x)), ", want ",
             hex(k.code));
  }
  return r.str();
}

std::string e4m3_golden() {
  struct Case { float x; uint32_t satfinite; uint32_t nosat; };
  const Case cases[] = {{464.0f, 0x7e, 0x7e},
                        {465.0f, 0x7e, 0x7f},
                        {std::ldexp(1.0f, -10), 0x00, 0x00},
                        {std::ldexp(3.0f, -10), 0x02, 0x02},
                        {std::ldexp(1.0625f, -6), 0x08, 0x08},
                        {std::ldexp(1.1875f, -6), 0x0a, 0x0a},
                        {-1e-30f, 0x80, 0x80},
                        {0.16666667f, 0x23, 0x23}};
  Report r;
  for (const Case& k : cases) {
    const uint32_t sat = e4m3_encode_satfinite(k.x);
    const uint32_t nosat = E4M3::encode<Round::kNearestEven, Overflow::kSpecial>(k.x);
    r.expect(sat == k.satfinite, "satfinite(", k.x, ") = ", hex(sat), ", want ", hex(k.satfinite));
    r.expect(nosat == k.nosat, "nosat(", k.x, ") = ", hex(nosat), ", want ", hex(k.nosat));
  }
  return r.str();
}

std::string constants_golden() {
  volatile float one = 1.0f;  // computed at run time, in this process's fp32
  Report r;
  r.expect(f32_bits(one / 6.0f) == 0x3E2AAAABu && kInv6Bits == 0x3E2AAAABu, "fl32(1/6)");
  r.expect(f32_bits(one / 448.0f) == 0x3B124925u && kInv448Bits == 0x3B124925u, "fl32(1/448)");
  r.expect(f32_bits(1e-4f) == 0x38D1B717u && kFp8AmaxFloorBits == 0x38D1B717u, "fl32(1e-4)");
  return r.str();
}

std::string compressed_kv_golden() {
  // numerics.md 10: the input (-2^-10 written out), the scale and the codes.
  const float x[16] = {1.0f,   -0.5f,      0.25f,      0.171875f,   0.0859375f,   -0.0009765625f,
                       0.0f,   -0.0f,      0.75f,      0.6015625f,  0.40234375f,  0.19921875f,
                       0.099609375f,       0.050048828125f,         0.8984375f,   -1.0f};
  const uint8_t codes[16] = {0x7, 0xd, 0x3, 0x2, 0x1, 0x8, 0x0, 0x8,
                             0x6, 0x6, 0x4, 0x2, 0x1, 0x1, 0x7, 0xf};
  Report r;
  uint8_t packed[compressed_kv_entry_bytes(16)];
  r.expect(pack_compressed_kv(x, 16, packed), "finite input reported non-finite");
  r.expect(packed[8] == 0x23, "scale ", hex(packed[8]), ", want 0x23");
  for (int k = 0; k < 8; ++k) {  // element 2k in the low nibble of byte k
    const uint32_t want = codes[2 * k] | (codes[2 * k + 1] << 4);
    r.expect(packed[k] == want, "byte ", k, " = ", hex(packed[k]), ", want ", hex(want));
  }
  float back[16];
  unpack_compressed_kv(packed, 16, back);
  float max_back = 0.0f;
  for (float v : back) max_back = std::fmax(max_back, std::fabs(v));
  r.expect(max_back == 1.03125f, "dequantized max ", max_back, ", want 1.03125");
  const float zeros[16] = {};
  uint8_t zero_scale = 0, zero_codes[16];
  quantize_compressed_kv_block(zeros, &zero_scale, zero_codes);
  r.expect(zero_scale == 0x01, "all-zero block scale ", hex(zero_scale), ", want 0x01");
  for (uint8_t c : zero_codes) r.expect(c == 0, "all-zero block code ", hex(c));
  return r.str();
}

// One block whose first element is `amax` and the rest zero: {scale, code of element 0}.
template <typename Quantize>
std::pair<uint32_t, uint32_t> one_hot_block(Quantize quantize, float amax) {
  float x[32] = {};
  x[0] = amax;
  uint8_t scale = 0, codes[32];
  quantize(x, &scale, codes);
  return {scale, codes[0]};
}

// Published {amax -> scale byte, element-0 code} cases of an E8M0-scaled 32-block recipe.
struct ScaleCase {
  float amax;
  uint32_t scale;
  int code;  // -1: not published
};

template <typename Quantize, size_t N>
std::string scale_cases(Quantize quantize, const ScaleCase (&cases)[N]) {
  Report r;
  for (const ScaleCase& k : cases) {
    const auto [scale, code] = one_hot_block(quantize, k.amax);
    r.expect(scale == k.scale, "amax ", k.amax, ": scale ", hex(scale), ", want ", hex(k.scale));
    r.expect(k.code < 0 || code == static_cast<uint32_t>(k.code), "amax ", k.amax, ": code ",
             hex(code));
  }
  return r.str();
}

std::string index_golden() {
  const ScaleCase cases[] = {{3.0f, 0x7e, 0x7}, {3.015625f, 0x7f, 0x5}, {6.0f, 0x7f, -1},
                             {1e-38f, 0x01, -1}};
  return scale_cases(quantize_index_block, cases);
}

std::string window_golden() {
  const ScaleCase cases[] = {{448.0f, 0x7f, 0x7e}, {1.0f, 0x77, 0x78}, {1e-5f, 0x69, -1},
                             {3000.0f, 0x82, 0x7c}};
  return scale_cases(quantize_fp8_block, cases);
}

std::string entry_sizes() {
  Report r;
  r.expect(sizeof(CompressedKvEntry<512>) == 288, "sizeof(CompressedKvEntry<512>)");
  r.expect(sizeof(IndexKeysEntry<128>) == 68, "sizeof(IndexKeysEntry<128>)");
  r.expect(sizeof(WindowKvEntry<512>) == 528, "sizeof(WindowKvEntry<512>)");
  r.expect(entry_bytes(CacheFormat::kCompressedKvFp4, 512) == 288, "entry_bytes(main KV, 512)");
  r.expect(entry_bytes(CacheFormat::kIndexKeysFp4, 128) == 68, "entry_bytes(index key, 128)");
  r.expect(entry_bytes(CacheFormat::kWindowKvFp8, 512) == 528, "entry_bytes(SWA, 512)");
  return r.str();
}

// Seeded bf16 values with magnitudes in [2^-12, 2^10): inside the range of every format (the
// main KV E4M3 scale saturates at 448, i.e. amax 2688). mt19937 is specified by the standard, so
// the rows are the same everywhere.
std::vector<float> random_rows(int n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    const uint32_t bits = gen();
    const uint32_t exponent = 127 - 12 + bits % 22;
    v = bf16_decode(((bits >> 8) & 0x8000u) | (exponent << 7) | ((bits >> 16) & 0x7Fu));
  }
  return x;
}

// unpack_rows(pack_rows(x)) against the block quantizer of qdq.h, reading every code and scale
// back from the bytes by the layout of packed.h, and |x - y| within the format's bound.
std::string pack_round_trip(CacheFormat f, int dim) {
  constexpr int kRows = 7;
  const std::vector<float> x = random_rows(kRows * dim, 0xd5a41u + dim);
  const std::vector<uint8_t> bytes = pack_rows(f, x, kRows, dim);
  const std::vector<float> y = unpack_rows(f, bytes, kRows, dim);
  const int eb = entry_bytes(f, dim);
  const int block = info(f).block;
  const bool fp4 = f != CacheFormat::kWindowKvFp8;
  Report r;
  for (int row = 0; row < kRows; ++row) {
    const uint8_t* entry = bytes.data() + static_cast<size_t>(row) * eb;
    const uint8_t* scales = entry + (fp4 ? dim / 2 : dim);
    for (int b = 0; b < dim / block; ++b) {
      const float* xb = x.data() + static_cast<size_t>(row) * dim + b * block;
      uint8_t scale = 0, codes[32];
      if (f == CacheFormat::kCompressedKvFp4) quantize_compressed_kv_block(xb, &scale, codes);
      if (f == CacheFormat::kIndexKeysFp4) quantize_index_block(xb, &scale, codes);
      if (f == CacheFormat::kWindowKvFp8) quantize_fp8_block(xb, &scale, codes);
      r.expect(scales[b] == scale, "row ", row, " block ", b, ": scale byte");
      const float s = f == CacheFormat::kCompressedKvFp4 ? e4m3_decode(scale) : e8m0_decode(scale);
      for (int i = 0; i < block; ++i) {
        const int e = b * block + i;
        const uint32_t stored = fp4 ? (entry[e / 2] >> (4 * (e % 2))) & 0xFu : entry[e];
        r.expect(stored == codes[i], "row ", row, " element ", e, ": code");
        const float want = round_to_bf16((fp4 ? e2m1_decode(codes[i]) : e4m3_decode(codes[i])) * s);
        const float got = y[static_cast<size_t>(row) * dim + e];
        r.expect(f32_bits(got) == f32_bits(want), "row ", row, " element ", e, ": value");
        const float err = std::fabs(xb[i] - got);
        // FP4: at most one code gap of 2 halved, or the clamp at 6; FP8: half an E4M3 ulp. The
        // 2^-20 slack covers the fp32 rounding of x / s.
        const float bound = (fp4 ? s : std::fabs(xb[i]) / 16 + std::ldexp(s, -10)) * (1 + 0x1p-20f);
        r.expect(err <= bound, "row ", row, " element ", e, ": error ", err, " > ", bound);
      }
    }
  }
  return r.str();
}

std::string bf16_round_trip() {
  const std::vector<float> x = random_rows(3 * 64, 0xbf16u);
  const std::vector<uint8_t> bytes = pack_rows(CacheFormat::kBf16, x, 3, 64);
  const std::vector<float> y = unpack_rows(CacheFormat::kBf16, bytes, 3, 64);
  Report r;
  for (size_t i = 0; i < x.size(); ++i) r.expect(f32_bits(x[i]) == f32_bits(y[i]), "element ", i);
  return r.str();
}

}  // namespace

int run_selfcheck(std::ostream& out, bool inject_failure) {
  struct Check {
    const char* name;
    std::function<std::string()> run;
  };
  std::vector<Check> checks = {
      {"E2M1/E4M3/E8M0: every code decodes and re-encodes to itself", minifloat_round_trips},
      {"E2M1 golden vectors (numerics.md 10)", e2m1_golden},
      {"E4M3 golden vectors, satfinite and nosat (numerics.md 10)", e4m3_golden},
      {"fl32 constants 1/6, 1/448, 1e-4 (numerics.md 10)", constants_golden},
      {"main KV block: scale 0x23, codes 7 d 3 2 1 8 0 8 6 6 4 2 1 1 7 f", compressed_kv_golden},
      {"indexer block E8M0 ceil scales (numerics.md 10)", index_golden},
      {"window FP8 block E8M0 scales (numerics.md 10)", window_golden},
      {"packed entry sizes 288 / 68 / 528", entry_sizes},
      {"pack/unpack main KV fp4 (dim 512, random rows)",
       [] { return pack_round_trip(CacheFormat::kCompressedKvFp4, 512); }},
      {"pack/unpack index key fp4 (dim 128, random rows)",
       [] { return pack_round_trip(CacheFormat::kIndexKeysFp4, 128); }},
      {"pack/unpack SWA KV fp8 (dim 512, random rows)",
       [] { return pack_round_trip(CacheFormat::kWindowKvFp8, 512); }},
      {"pack/unpack bf16 (dim 64, random rows)", bf16_round_trip},
  };
  if (inject_failure) {
    checks.push_back({"injected failure (--inject-failure)",
                      [] { return std::string("deliberate failure, to test the exit code"); }});
  }
  int passed = 0, failed = 0;
  for (const Check& c : checks) {
    std::string detail;
    try {
      detail = c.run();
    } catch (const std::exception& e) {
      detail = std::string("threw: ") + e.what();
    }
    if (detail.empty()) {
      ++passed;
      out << "ok    " << c.name << "\n";
    } else {
      ++failed;
      out << "FAIL  " << c.name << ": " << detail << "\n";
    }
  }
  out << "selfcheck: " << passed << " passed, " << failed << " failed\n";
  return failed == 0 ? runner::kExitOk : runner::kExitCheckFailed;
}

Verb add_selfcheck_verb(CLI::App& parent) {
  auto inject = std::make_shared<bool>(false);
  CLI::App* app = parent.add_subcommand(
      "selfcheck", "fast self-check of the FP4/FP8 formats: round trips and golden vectors");
  // Hidden (empty group): adds one failing check, so tests can see exit code 1.
  app->add_flag("--inject-failure", *inject, "add a failing check")->group("");
  return {app, [inject] { return run_selfcheck(std::cout, *inject); }};
}

}  // namespace dsv41::scenarios::cli
