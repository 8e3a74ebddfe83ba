// reference/weights.h
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

#include "reference/config.h"
#include "reference/linear.h"
#include "reference/safetensors.h"

namespace dsv41::reference {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Every tensor the config requires, in a fixed order (fp8/fp4 weights followed by their .scale).
// `head_dtype` is F32 (the official model's own parameter) or BF16 (the released checkpoint).
std::vector<TensorSpec> expected_tensors(const ModelConfig& c, DType head_dtype = DType::kF32);

struct AttentionWeights {
  LinearWeight wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm;  // bf16 values
  std::vector<float> attn_sink;        // [H] fp32
  bool has_compressor = false;
  LinearWeight comp_wkv, comp_wgate;   // comp_wgate only for ratio > 1
  std::vector<float> comp_norm;
  bool has_indexer = false;
  LinearWeight idx_wq_b, idx_weights_proj;
  bool has_index_keys = false;         // kv source: owns wk / k_norm
  LinearWeight idx_wk;
  std::vector<float> idx_k_norm;
};

struct MoeWeights {
  LinearWeight gate;                   // BF16 [E, dim], used as fp32
  std::vector<float> gate_bias;        // [E] fp32
  std::vector<LinearWeight> w1, w2, w3;  // routed experts
  LinearWeight s_w1, s_w2, s_w3;       // shared expert
};

struct HcWeights {
  std::vector<float> fn;    // [(2+hc)*hc, hc*dim] fp32
  std::vector<float> base;  // [(2+hc)*hc]
  std::vector<float> scale; // [3]
};

struct EngramWeights {
  std::vector<uint8_t> table;        // [rows, head_dim] E4M3 codes
  std::vector<uint8_t> table_scale;  // [rows, head_dim/32] E8M0 codes
  int64_t rows = 0;
  LinearWeight wkv;
  std::vector<float> q_weight, k_weight;  // [hc, dim] bf16 values
};

struct BlockWeights {
  int layer = 0;
  std::vector<float> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights ffn;
  bool has_engram = false;
  EngramWeights engram;
};

struct DSparkWeights {
  LinearWeight main_proj;
  std::vector<float> main_norm;
  std::vector<float> norm;
  std::vector<float> markov_embed;   // [vocab, rank] bf16 values
  LinearWeight markov_head;          // F32 [vocab, rank]
  LinearWeight confidence_proj;      // F32 [1, dim + rank]
};

struct ModelWeights {
  std::vector<float> embed;   // [vocab, dim] bf16 values
  std::vector<float> norm;    // [dim]
  LinearWeight head;          // F32 [vocab, dim] (a BF16 file head is widened exactly)
  std::vector<BlockWeights> blocks;  // [total_layers]: backbone then DSpark blocks
  DSparkWeights dspark;

  // Loads and checks every tensor; extra tensors are an error.
  static ModelWeights load(const std::string& path, const ModelConfig& c);
  static ModelWeights load(const safetensors::SafetensorsFile& file, const ModelConfig& c);
};

// Deterministic random weights for `c` in the official format (same names, shapes, dtypes):
// SplitMix64 streams keyed by (seed, tensor name), so one tensor's values do not depend on
// which others exist. Values are scaled so activations stay O(1) through the network.
std::vector<safetensors::Tensor> generate_weights(const ModelConfig& c, uint64_t seed);

}  // namespace dsv41::reference
