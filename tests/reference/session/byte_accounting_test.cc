// Byte accounting of the KV state. Expected values are derived by hand from the formulas of
// docs/bytes.md, not copied from the program:
//   main KV entry  = d/2 + d/16 bytes (FP4 nibbles + E4M3 scale per 16), d = head_dim
//   index key entry = d/2 + d/32 bytes (FP4 nibbles + E8M0 scale per 32), d = index_head_dim
//   SWA entry      = d + d/32 bytes (FP8 values + E8M0 scale per 32), d = head_dim
#include "reference/session/byte_accounting.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "reference/ops/config.h"

namespace dsv41::reference::session {
namespace {

TEST(BytesRational, NormalizesAndAdds) {
  EXPECT_EQ(Rational::of(356, 2), (Rational{178, 1}));
  EXPECT_EQ(Rational::of(356, 3).str(), "356/3");
  EXPECT_EQ((Rational::of(1, 2) + Rational::of(1, 3)).str(), "5/6");
  EXPECT_EQ(Rational::of(890, 1).str(), "890");
  EXPECT_DOUBLE_EQ(Rational::of(1, 4).value(), 0.25);
  EXPECT_THROW(Rational::of(1, 0), dsv41::Error);
}

// Released: head_dim 512 -> main 256 + 32 = 288; index_head_dim 128 -> index 64 + 4 = 68.
// Owners 2, 8, 14 (ratio 2) and 20 (ratio 1): (3/2 + 1) x (288 + 68) = 5/2 x 356 = 890.
TEST(BytesAccounting, ReleasedIs890PerToken) {
  const ByteAccounting b = byte_accounting(load_config("full"));
  EXPECT_EQ(b.global_bytes_per_token, (Rational{890, 1}));
  ASSERT_EQ(b.owners.size(), 4u);
  const int layers[] = {2, 8, 14, 20};
  const int ratios[] = {2, 2, 2, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b.owners[i].layer, layers[i]);
    EXPECT_EQ(b.owners[i].ratio, ratios[i]);
    EXPECT_EQ(b.owners[i].main_entry_bytes, 288);
    EXPECT_EQ(b.owners[i].index_entry_bytes, 68);
    EXPECT_EQ(b.owners[i].entry_bytes, 356);
    EXPECT_EQ(b.owners[i].bytes_per_token, (Rational{356 / ratios[i], 1}));
  }
  EXPECT_EQ(b.owners[0].reader_layers, (std::vector<int>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.owners[3].reader_layers.size(), 20u);  // layers 20..39
  // bf16 caches: (2 x 512 + 2 x 128) x 5/2 = 1280 x 5/2 = 3200.
  EXPECT_EQ(b.bf16_bytes_per_token, (Rational{3200, 1}));
}

TEST(BytesAccounting, ReleasedMillionTokens) {
  const ByteAccounting b = byte_accounting(load_config("full"));
  // 10^6 tokens: 3 x 500000 x 356 + 1000000 x 356 = 890 x 10^6 B = 890 MB = 848.77 MiB.
  EXPECT_EQ(global_bytes_for_tokens(b, 1000000), 890000000);
  EXPECT_NEAR(890000000 / 1048576.0, 848.770, 5e-4);
}

TEST(BytesAccounting, ReleasedPerSessionState) {
  const ByteAccounting b = byte_accounting(load_config("full"));
  // SWA: (40 + 3) rings x 128 slots x (512 + 16) B = 43 x 128 x 528 = 2906112.
  EXPECT_EQ(b.window_kv_layers, 43);
  EXPECT_EQ(b.window_kv_slots, 128);
  EXPECT_EQ(b.window_kv_entry_bytes, 528);
  EXPECT_EQ(b.window_kv_bytes_per_session, 2906112);
  // Compressor partial groups: 3 ratio-2 owners x 1 token x 512 x 2 (kv, score) x 4 B = 12288.
  EXPECT_EQ(b.compressor_partial_bytes_per_session, 12288);
  EXPECT_EQ(b.owners[3].partial_state_bytes, 0);  // ratio 1 keeps no partial group
}

// Tiny: head_dim 128 -> main 64 + 8 = 72; index_head_dim 64 -> index 32 + 2 = 34; entry 106.
// Owners 2, 4 (ratio 2) and 6 (ratio 1): 106/2 + 106/2 + 106 = 212 B/token.
// SWA: (10 + 1) x 64 x (128 + 4) = 11 x 64 x 132 = 92928 B.
// Compressor partial: 2 owners x 1 x 128 x 2 x 4 = 2048 B.
TEST(BytesAccounting, Tiny) {
  const ByteAccounting b = byte_accounting(load_config("tiny"));
  EXPECT_EQ(b.global_bytes_per_token, (Rational{212, 1}));
  ASSERT_EQ(b.owners.size(), 3u);
  EXPECT_EQ(b.owners[0].entry_bytes, 106);
  EXPECT_EQ(b.owners[2].reader_layers, (std::vector<int>{6, 7, 8, 9}));
  EXPECT_EQ(b.window_kv_bytes_per_session, 92928);
  EXPECT_EQ(b.compressor_partial_bytes_per_session, 2048);
  // 333 tokens (odd: one token pending in each ratio-2 owner): 2 x 166 x 106 + 333 x 106 = 70490.
  EXPECT_EQ(global_bytes_for_tokens(b, 333), 70490);
  EXPECT_EQ(global_bytes_for_tokens(b, 0), 0);
}

// The sizes follow the config: tiny with head_dim 256 -> main 128 + 16 = 144, entry 144 + 34 =
// 178, per token 178/2 x 2 + 178 = 356; SWA entry 256 + 8 = 264.
TEST(BytesAccounting, FollowsTheConfig) {
  ModelConfig c = load_config("tiny");
  c.head_dim = 256;
  validate(c);
  const ByteAccounting b = byte_accounting(c);
  EXPECT_EQ(b.owners[0].main_entry_bytes, 144);
  EXPECT_EQ(b.global_bytes_per_token, (Rational{356, 1}));
  EXPECT_EQ(b.window_kv_entry_bytes, 264);
}

// A fractional rate stays exact: index_head_dim 32 -> 16 + 1 = 17, entry 72 + 17 = 89, so a
// ratio-2 owner stores 89/2 B/token.
TEST(BytesAccounting, ExactFractionalRate) {
  ModelConfig c = load_config("tiny");
  c.index_head_dim = 32;
  c.rope_head_dim = 32;
  validate(c);
  const ByteAccounting b = byte_accounting(c);
  EXPECT_EQ(b.owners[0].bytes_per_token, (Rational{89, 2}));
  // 89/2 + 89/2 + 89 = 178.
  EXPECT_EQ(b.global_bytes_per_token, (Rational{178, 1}));
  EXPECT_EQ(global_bytes_for_tokens(b, 3), 89 + 89 + 3 * 89);
}

}  // namespace
}  // namespace dsv41::reference::session
