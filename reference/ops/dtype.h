// reference/ops/dtype.h
//
// DType: the storage dtypes of the official checkpoint (and of safetensors files), with their
// names and byte counts. A weight keeps its storage dtype (LinearWeight::dtype picks the linear's
// arithmetic, reference/ops/linear.h); activations are Tensor<float> (reference/ops/tensor.h).
//
//   DType     name       bits  what
//   kF32      F32        32    fp32
//   kBF16     BF16       16    bf16
//   kF8E4M3   F8_E4M3    8     fp8 E4M3 (weights, Engram tables)
//   kF8E8M0   F8_E8M0    8     E8M0 scales (2^(b - 127); 0xFF is NaN)
//   kF4       F4         4     E2M1, two per byte, element 2k in the low nibble
//   kI32      I32        32    int32
//   kI64      I64        64    int64
//   kU8       U8         8     uint8 (raw bytes: port dumps' packed caches and masks)
//
// Example:
//   DType d = dtype_from_name("F8_E4M3");       // DType::kF8E4M3
//   int64_t n = stored_bytes(DType::kF4, 64);   // 32
#pragma once

#include <cstdint>
#include <string>

namespace dsv41::reference {

enum class DType : uint8_t { kF32, kBF16, kF8E4M3, kF8E8M0, kF4, kI32, kI64, kU8 };

const char* dtype_name(DType d);                 // "F32", "BF16", "F8_E4M3", ...
DType dtype_from_name(const std::string& name);  // a dsv41::Error naming the known names otherwise

int dtype_bits(DType d);                         // bits per element: 32, 16, 8, 8, 4, 32, 64, 8

// Stored bytes of `numel` elements of `d` (F4: numel must be even).
int64_t stored_bytes(DType d, int64_t numel);

}  // namespace dsv41::reference
