// reference/ops/rope against the OFFICIAL code's outputs (golden/oracle), bit for bit:
//   - the cos/sin of the four precompute_freqs_cis tables of kernels.h5 (tiny and released
//     settings, window and compressed/YaRN), and the tables the tiny config gives each layer;
//   - kernels.h5 rope/apply_y (forward) and apply_y_inverse (conjugate);
//   - the prefill chains that end in RoPE, for layers 0, 2, 6, 8 (333 positions):
//       sparse_q  = rope(wq_b(q_norm(wq_a(attn_in))))                       [333, 4, 128]
//       sparse_kv = fp8 QDQ(rope(kv_norm(wkv(attn_in)))), the window rows   [333, 128]
//     which exercise linear (fp8), RMSNorm and RoPE together on real activations;
// plus exact properties (position 0 is the identity, the YaRN ramp's end points) and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "golden/golden_io.h"
#include "reference/ops/config.h"
#include "reference/ops/linear.h"
#include "reference/checkpoint/weights.h"
#include "reference/ops/rmsnorm.h"
#include "reference/ops/rope.h"
#include "reference/checkpoint/safetensors.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

using golden::Array;
using golden::H5File;

const std::string kOracle = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/";

ModelConfig tiny() { return load_config_file(kOracle + "config.json"); }

// The four tables of kernels.h5 with their precompute_freqs_cis arguments (the groups' `args`
// attribute: dim, seqlen, original_seq_len, base, factor, beta_fast, beta_slow).
struct OracleTable {
  const char* group;
  RopeParams params;
};
const OracleTable kTables[] = {
    {"rope/freqs_tiny_window", {32, 512, 0, 10000.0, 16.0, 32, 1}},
    {"rope/freqs_tiny_compressed", {32, 512, 65536, 160000.0, 16.0, 32, 1}},
    {"rope/freqs_real_window", {64, 1024, 0, 10000.0, 16.0, 32, 1}},          // released settings
    {"rope/freqs_real_compressed", {64, 1024, 65536, 160000.0, 16.0, 32, 1}},  // released settings
};

// Compares a table's cos/sin bits with an oracle group [positions, rd/2] (real = cos, imag = sin).
int64_t count_table_differences(const RopeTable& t, const H5File& f, const std::string& group) {
  const Array<float> re = f.read<float>(group + "/real", 2);
  const Array<float> im = f.read<float>(group + "/imag", 2);
  const int64_t positions = re.dim(0), half = re.dim(1);
  EXPECT_EQ(half, t.rope_dim() / 2) << group;
  EXPECT_LE(positions, t.max_seq_len()) << group;
  int64_t differing = 0, nonzero = 0;
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float c = t.cos(p)[i], s = t.sin(p)[i];
      EXPECT_FALSE(std::isnan(c) || std::isnan(s));
      nonzero += c != 0.0f && s != 0.0f;
      differing += dsv41::f32_bits(c) != dsv41::f32_bits(re.at(p, i));
      differing += dsv41::f32_bits(s) != dsv41::f32_bits(im.at(p, i));
    }
  }
  EXPECT_GT(nonzero, positions * half / 2) << group;
  std::printf("[rope] %s: %lld cos/sin values, %lld differ\n", group.c_str(),
              static_cast<long long>(2 * positions * half), static_cast<long long>(differing));
  return differing;
}

TEST(RopeOracle, TablesMatchBitwise) {
  H5File f(kOracle + "kernels.h5");
  for (const OracleTable& t : kTables) {
    EXPECT_EQ(count_table_differences(RopeTable(t.params), f, t.group), 0) << t.group;
  }
}

TEST(RopeOracle, TinyConfigGivesEachLayerItsTable) {
  H5File f(kOracle + "kernels.h5");
  const ModelConfig c = tiny();
  // Layer 0 (ratio 0), layer 2 (ratio 2), layer 6 (ratio 1), layer 10 (DSpark, ratio 0).
  EXPECT_EQ(count_table_differences(RopeTable::for_layer(c, 0), f, "rope/freqs_tiny_window"), 0);
  EXPECT_EQ(count_table_differences(RopeTable::for_layer(c, 2), f, "rope/freqs_tiny_compressed"), 0);
  EXPECT_EQ(count_table_differences(RopeTable::for_layer(c, 6), f, "rope/freqs_tiny_compressed"), 0);
  EXPECT_EQ(count_table_differences(RopeTable::for_layer(c, 10), f, "rope/freqs_tiny_window"), 0);
  EXPECT_EQ(RopeTable::for_layer(c, 10).params().original_seq_len, 0) << "no YaRN on window layers";
}

TEST(RopeOracle, ApplyAndInverseMatchBitwise) {
  H5File f(kOracle + "kernels.h5");
  const Array<uint16_t> x = f.read<uint16_t>("rope/apply_x/bits", 4);          // [1, 8, 4, 32] bf16
  const Array<uint16_t> y = f.read<uint16_t>("rope/apply_y/bits", 4);          // positions 100..107
  const Array<uint16_t> yi = f.read<uint16_t>("rope/apply_y_inverse/bits", 4);  // inverse of y
  const RopeTable t(kTables[1].params);  // freqs_tiny_compressed[100:108]
  const int64_t S = x.dim(1), H = x.dim(2), rd = x.dim(3);
  int64_t fwd_diff = 0, inv_diff = 0, changed = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t h = 0; h < H; ++h) {
      const size_t base = static_cast<size_t>((s * H + h) * rd);
      std::vector<float> row(static_cast<size_t>(rd)), back(row.size());
      for (int64_t i = 0; i < rd; ++i) row[i] = formats::bf16_decode(x.data[base + i]);
      t.apply(row.data(), 100 + s);
      for (int64_t i = 0; i < rd; ++i) {
        ASSERT_FALSE(std::isnan(row[i]));
        changed += formats::bf16_encode(row[i]) != x.data[base + i];
        fwd_diff += formats::bf16_encode(row[i]) != y.data[base + i];
        back[i] = formats::bf16_decode(y.data[base + i]);
      }
      t.apply(back.data(), 100 + s, /*inverse=*/true);
      for (int64_t i = 0; i < rd; ++i) inv_diff += formats::bf16_encode(back[i]) != yi.data[base + i];
    }
  }
  std::printf("[rope] apply: %zu values, %lld differ; inverse: %lld differ\n", y.data.size(),
              static_cast<long long>(fwd_diff), static_cast<long long>(inv_diff));
  EXPECT_GT(changed, static_cast<int64_t>(y.data.size()) / 2) << "the rotation is not the identity";
  EXPECT_EQ(fwd_diff, 0);
  EXPECT_EQ(inv_diff, 0);
}

Tensor<float> bf16_rows(const Array<uint16_t>& a, int64_t rows, int64_t cols, const std::string& name) {
  std::vector<float> v(a.data.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = formats::bf16_decode(a.data[i]);
  return Tensor<float>({rows, cols}, std::move(v), name);
}

TEST(RopeOracle, PrefillQueryAndWindowKvChainsMatchBitwise) {
  const ModelConfig c = tiny();
  H5File attn(kOracle + "prefill_attn.h5");
  const auto weights = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  const int64_t dim = c.dim, H = c.n_heads, D = c.head_dim, rd = c.rope_head_dim, q_lora = c.q_lora_rank;
  auto norm_weight = [&](const std::string& name, int64_t n) {
    return weights.get(name, DType::kBF16, {n}).to_f32();
  };
  int64_t q_total = 0, q_diff = 0, kv_total = 0, kv_diff = 0;
  for (int layer : {0, 2, 6, 8}) {
    char g[32];
    std::snprintf(g, sizeof(g), "prefill/layer%02d/", layer % 100);
    const std::string p = "layers." + std::to_string(layer) + ".attn.";
    const Array<uint16_t> x = attn.read<uint16_t>(std::string(g) + "attn_in/bits", 3);  // [1, T, dim]
    const int64_t T = x.dim(1);
    const Tensor<float> attn_in = bf16_rows(x, T, dim, "attn_in");
    const RopeTable rope = RopeTable::for_layer(c, layer);

    // q: [T, H * D] bf16, RoPE on the last rd channels of every head at position t.
    const LinearWeight wq_a = checkpoint::load_linear(weights, p + "wq_a", DType::kF8E4M3, q_lora, dim);
    const LinearWeight wq_b = checkpoint::load_linear(weights, p + "wq_b", DType::kF8E4M3, H * D, q_lora);
    Tensor<float> q = linear(rms_norm(linear(attn_in, wq_a), norm_weight(p + "q_norm.weight", q_lora), c.norm_eps), wq_b);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) rope.apply(q.row(t) + h * D + (D - rd), t);
    }
    const Array<uint16_t> want_q = attn.read<uint16_t>(std::string(g) + "sparse_q/bits", 4);  // [1, T, H, D]
    for (size_t i = 0; i < want_q.data.size(); ++i) q_diff += formats::bf16_encode(q.data()[i]) != want_q.data[i];
    q_total += q.numel();

    // window kv: [T, D] bf16: kv_norm(wkv(x)), RoPE, then act_quant in place (fp8 QDQ, block 32).
    const LinearWeight wkv = checkpoint::load_linear(weights, p + "wkv", DType::kF8E4M3, D, dim);
    Tensor<float> kv = rms_norm(linear(attn_in, wkv), norm_weight(p + "kv_norm.weight", D), c.norm_eps);
    const Array<uint16_t> want_kv = attn.read<uint16_t>(std::string(g) + "sparse_kv/bits", 3);  // [1, n, D]
    int64_t nonzero = 0;
    for (int64_t t = 0; t < T; ++t) {
      float* row = kv.row(t);
      rope.apply(row + (D - rd), t);
      for (int64_t b = 0; b < D / 32; ++b) {
        uint8_t scale, codes[32];
        ASSERT_TRUE(formats::quantize_fp8_block(row + b * 32, &scale, codes));
        for (int i = 0; i < 32; ++i) row[b * 32 + i] = formats::dequant_fp8_e8m0(codes[i], scale);
      }
      for (int64_t i = 0; i < D; ++i) {
        nonzero += row[i] != 0.0f;
        kv_diff += formats::bf16_encode(row[i]) != want_kv.data[static_cast<size_t>(t * D + i)];
      }
    }
    EXPECT_GT(nonzero, T * D / 2);
    kv_total += T * D;
    std::printf("[rope] layer %d (%s table): sparse_q %lld differ, window kv %lld differ so far\n", layer,
                name(RopeTable::for_layer(c, layer).params().original_seq_len > 0 ? RopeKind::kCompressed
                                                                                 : RopeKind::kWindow),
                static_cast<long long>(q_diff), static_cast<long long>(kv_diff));
  }
  std::printf("[rope] prefill chains: sparse_q %lld values, %lld differ; window kv %lld values, %lld differ\n",
              static_cast<long long>(q_total), static_cast<long long>(q_diff), static_cast<long long>(kv_total),
              static_cast<long long>(kv_diff));
  EXPECT_EQ(q_diff, 0);
  EXPECT_EQ(kv_diff, 0);
}

TEST(Rope, PositionZeroIsTheIdentity) {
  // cos 0 = 1, sin 0 = 0: a*1 - b*0 = a exactly, so a bf16 row comes back unchanged.
  std::mt19937_64 rng(test::seed_for("rope/identity/rd=64"));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const RopeTable t = RopeTable::make(load_config_preset("full"), RopeKind::kCompressed);
  std::vector<float> x(static_cast<size_t>(t.rope_dim())), y;
  for (float& v : x) v = formats::round_to_bf16(normal(rng));
  y = x;
  t.apply(y.data(), 0);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(dsv41::f32_bits(x[i]), dsv41::f32_bits(y[i])) << i;
  t.apply(y.data(), 0, /*inverse=*/true);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(dsv41::f32_bits(x[i]), dsv41::f32_bits(y[i])) << i;
}

TEST(Rope, YarnRampKeepsHighFrequenciesAndDividesLowOnes) {
  // ramp 0 (i <= low): f' = f/16 * 0 + f * 1 = f exactly; ramp 1 (i >= high): f' = f/16 exactly.
  // Released settings: rd 64, base 160000, L0 65536: corr(32) = 15.45, corr(1) = 24.71, so
  // low = 15, high = 25, and the ramp (i - 15) / 10 blends i = 16..24.
  const ModelConfig full = load_config_preset("full");
  const RopeParams with = rope_params(full, RopeKind::kCompressed);
  RopeParams without = with;
  without.original_seq_len = 0;
  const RopeTable a(with), b(without);
  int64_t kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < with.rope_dim / 2; ++i) {
    const float f = b.freqs()[static_cast<size_t>(i)], g = a.freqs()[static_cast<size_t>(i)];
    if (g == f) {
      ++kept;
    } else if (g == f / static_cast<float>(with.factor)) {
      ++divided;
    } else {
      ++blended;
      EXPECT_TRUE(g < f && g > f / static_cast<float>(with.factor)) << i;
    }
  }
  std::printf("[rope] released YaRN: %lld kept, %lld blended, %lld divided by %g\n", static_cast<long long>(kept),
              static_cast<long long>(blended), static_cast<long long>(divided), with.factor);
  EXPECT_EQ(kept, 16);    // i = 0..15
  EXPECT_EQ(divided, 7);  // i = 25..31
  EXPECT_EQ(blended, 9);  // i = 16..24
}

TEST(Rope, RejectsOutOfRangePositionsAndBadParameters) {
  const RopeTable t = RopeTable::make(tiny(), RopeKind::kWindow);
  std::vector<float> x(32, 1.0f);
  EXPECT_THROW(t.apply(x.data(), 512), Error);
  EXPECT_THROW(t.apply(x.data(), -1), Error);
  EXPECT_THROW(t.cos(512), Error);
  EXPECT_THROW(RopeTable({31, 16, 0, 10000.0, 1.0, 32, 1}), Error);  // odd rd
  EXPECT_THROW(RopeTable({32, 0, 0, 10000.0, 1.0, 32, 1}), Error);   // no positions
  EXPECT_THROW(RopeTable({32, 16, 0, 1.0, 1.0, 32, 1}), Error);      // base 1
  EXPECT_THROW(RopeTable::for_layer(tiny(), 11), Error);              // no such layer
  EXPECT_THROW(RopeTable().apply(x.data(), 0), Error);                // empty table
}

}  // namespace
}  // namespace dsv41::reference
