// reference/checkpoint/weights.h
//
// The model's weights under the official checkpoint names, shapes and storage dtypes, loaded
// from a safetensors file and checked against the config; and a deterministic seeded generator
// that writes the same format, so any port can load identical random weights.
//
// Naming (prefix P = "layers.<L>." for backbone layers, "mtp.<i>." for DSpark blocks):
//   embed.weight BF16 [vocab, dim]; norm.weight BF16 [dim]; head.weight F32 or BF16 [vocab, dim]
//   P attn_norm / ffn_norm .weight BF16 [dim]; P hc_{attn,ffn}_{fn F32 [(2+hc)hc, hc*dim],
//     base F32 [(2+hc)hc], scale F32 [3]}
//   P attn.{wq_a F8 [q_lora, dim], q_norm BF16 [q_lora], wq_b F8 [H*D, q_lora], wkv F8 [D, dim],
//     kv_norm BF16 [D], wo_a BF16 [G*o_lora, H*D/G], wo_b F8 [dim, G*o_lora], attn_sink F32 [H]}
//   kv sources: P attn.compressor.{wkv F32 (ratio 2) / BF16 (ratio 1) [D, dim],
//     wgate F32 [D, dim] (ratio 2 only), norm BF16 [D]}
//   index sources: P attn.indexer.{wq_b F8 [Hi*Di, q_lora], weights_proj BF16 [Hi, dim]},
//     plus for kv sources wk BF16 [Di, D] and k_norm BF16 [Di]
//   P ffn.gate.{weight BF16 [E, dim], bias F32 [E]}; P ffn.experts.<e>.{w1, w3 F4 [inter, dim],
//     w2 F4 [dim, inter]} (scales E8M0 [out, in/32]); P ffn.shared_experts.{w1, w3, w2} F8
//   engram layers: P engram.{embed.weight F8 [rows, head_dim], embed.scale E8M0
//     [rows, head_dim/32], wkv F8 [(hc+1)*dim, cols*head_dim], q_weight, k_weight BF16 [hc, dim]}
//   DSpark block 0: mtp.0.main_proj F8 [dim, dim*targets], mtp.0.main_norm BF16 [dim];
//   last DSpark block: norm BF16 [dim], markov_head.embed.weight BF16 [vocab, rank],
//     markov_head.head.weight F32 [vocab, rank], confidence_head.proj.weight F32 [1, dim+rank]
//   fp8 tensors carry "<name>.scale" E8M0 [ceil(out/32), ceil(in/32)].
// mtp.*.embed / mtp.*.head are the shared embed / head (stored once).
//
// Errors: a missing, extra, misshaped or mistyped tensor is a dsv41::Error naming the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/dtype.h"
#include "reference/ops/engram.h"
#include "reference/ops/linear.h"
#include "reference/ops/mhc.h"
#include "reference/ops/moe.h"
#include "reference/checkpoint/safetensors.h"

namespace dsv41::reference::checkpoint {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Every tensor the config requires, in a fixed order (fp8/fp4 weights followed by their .scale).
// `head_dtype` is F32 (the official model's own parameter) or BF16 (the released checkpoint).
std::vector<TensorSpec> expected_tensors(const ModelConfig& c, DType head_dtype = DType::kF32);

// One layer's attention weights (checkpoint prefix "<P>attn.").
struct AttentionWeights {
  LinearWeight wq_a, wq_b, wkv, wo_a, wo_b;
  Tensor<float> q_norm, kv_norm;       // [q_lora], [D] bf16
  Tensor<float> attn_sink;             // [H] fp32
  bool has_compressor = false;
  LinearWeight comp_wkv, comp_wgate;   // comp_wgate only for ratio > 1
  Tensor<float> comp_norm;             // [D] bf16
  bool has_indexer = false;
  LinearWeight idx_wq_b, idx_weights_proj;
  bool has_index_keys = false;         // kv source: owns wk / k_norm
  LinearWeight idx_wk;
  Tensor<float> idx_k_norm;            // [Di] bf16
};

struct BlockWeights {
  int layer = 0;
  Tensor<float> attn_norm, ffn_norm;   // [dim] bf16
  HcWeights hc_attn, hc_ffn;           // reference/ops/mhc.h
  AttentionWeights attn;
  MoeWeights ffn;                      // reference/ops/moe.h
  bool has_engram = false;
  EngramWeights engram;                // reference/ops/engram.h
};

struct DSparkWeights {
  LinearWeight main_proj;
  Tensor<float> main_norm;           // [dim] bf16
  Tensor<float> norm;                // [dim] bf16
  Tensor<float> markov_embed;        // [vocab, rank] bf16 values
  LinearWeight markov_head;          // F32 [vocab, rank]
  LinearWeight confidence_proj;      // F32 [1, dim + rank]
};

// Every weight of the model, each tensor named by its checkpoint name (a backend that mirrors the
// weights in its own memory finds them again by that name, reference/seam/ops.h).
struct ModelWeights {
  Tensor<float> embed;        // "embed.weight" [vocab, dim] bf16 values
  Tensor<float> norm;         // "norm.weight" [dim] bf16
  LinearWeight head;          // F32 [vocab, dim] (a BF16 file head is widened exactly)
  std::vector<BlockWeights> blocks;  // [total_layers]: backbone then DSpark blocks
  DSparkWeights dspark;

  // Loads and checks every tensor; extra tensors are an error. `pack_fp4`: the F4 weights (the
  // routed experts) are held packed as in the file (LinearWeight::packed: 4 bits a value instead
  // of 32), for the released dims (docs/released-dims.md); every op gives the same bits.
  static ModelWeights load(const std::string& path, const ModelConfig& c, bool pack_fp4 = false);
  static ModelWeights load(const safetensors::SafetensorsFile& file, const ModelConfig& c, bool pack_fp4 = false);
};

// Reads "<prefix>.weight" (and "<prefix>.scale" for F8_E4M3/F4) with the official shapes; any
// mismatch is an error naming the tensor.
// `pack_fp4`: an F4 weight keeps the file's bytes (LinearWeight::packed) instead of values.
LinearWeight load_linear(const safetensors::SafetensorsFile& file, const std::string& prefix, DType dtype,
                         int64_t out, int64_t in, bool pack_fp4 = false);

// An Engram table from the checkpoint entries "layers.L.engram.embed.weight" (F8_E4M3
// [rows, head_dim]) and ".scale" (F8_E8M0 [rows, head_dim/32]); throws on another dtype or shape.
EngramTableRef engram_table(const safetensors::Entry& weight, const safetensors::Entry& scale);

// Deterministic random weights for `c` in the official format (same names, shapes, dtypes):
// SplitMix64 streams keyed by (seed, tensor name), so one tensor's values do not depend on
// which others exist. Values are scaled so activations stay O(1) through the network. Tensors
// are made on the reference's threads (each from its own stream: the same bytes for any count).
std::vector<safetensors::Entry> generate_weights(const ModelConfig& c, uint64_t seed);
// The generator's draws (exposed for its tests): a 64-bit draw's uniform numerator k in
// [-2^23, 2^23) (the value is k 2^-23, exact in fp32), and the fp4 code of the value 6 k 2^-23:
// formats::e2m1_encode(6.0f * (k * 2^-23)) for every k, found from the encoder's thresholds.
int64_t uniform_numerator(uint64_t draw);
uint8_t generated_fp4_code(int64_t k);
// One tensor of generate_weights (the same values: a tensor's stream is keyed by its name), for a
// caller that needs a few tensors of a config too large to generate whole (dsv41 vectors).
safetensors::Entry generate_tensor(const TensorSpec& spec, uint64_t seed);

}  // namespace dsv41::reference::checkpoint
