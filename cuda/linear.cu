// cuda/linear.cu ↔ reference/ops/linear.cc
//
// The weight-dtype paths of linear(), one thread per output element in the reference's order:
//   F8/F4   act_quant per 32-block (formats::quantize_fp8_block, as the host), then per output:
//           acc = 0; for each K block in order: partial = the exact block dot (a double sum of
//           exact products, rounded once), acc += (partial * a_s) * w_s in fp32; y = bf16(acc)
//   BF16    double sum in index order, rounded to fp32, then bf16
//   F32     fp32 FMA chain in index order (__fmaf_rn), fp32 out
// All arithmetic is correctly rounded (__*_rn, --fmad=false), in the host's order: BIT-EXACT.
// Invalid inputs (a non-bf16 value for F8/F4/BF16, a non-finite act_quant block) set a status
// flag; the host then re-runs the reference op, which raises its exact error.
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kBlock = 32;

__device__ inline bool is_bf16_value(float v) { return v != v || formats::round_to_bf16(v) == v; }

// One thread per (row, 32-block) of x [T, in]: xq [T, in] E4M3 values, xs [T, in/32] E8M0 values.
__global__ void act_quant_kernel(const float* __restrict__ x, int64_t T, int64_t in, float* __restrict__ xq,
                                 float* __restrict__ xs, int* __restrict__ status) {
  const int64_t nkb = in / kBlock;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * nkb) return;
  const float* xb = x + k * kBlock;  // rows are contiguous: block k of the flattened [T, in]
  bool ok = true;
  for (int i = 0; i < kBlock; ++i) ok = ok && is_bf16_value(xb[i]);
  uint8_t scale = 0, codes[kBlock];
  ok = formats::quantize_fp8_block(xb, &scale, codes) && ok;
  if (!ok) atomicExch(status, 1);
  xs[k] = formats::e8m0_decode(scale);
  for (int i = 0; i < kBlock; ++i) xq[k * kBlock + i] = formats::e4m3_decode(codes[i]);
}

// Flags any non-bf16 value of x [n].
__global__ void check_bf16_kernel(const float* __restrict__ x, int64_t n, int* __restrict__ status) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n && !is_bf16_value(x[k])) atomicExch(status, 1);
}

// The E8M0 scale of output o, K block kb (F8: 32x32 tiles; F4: per row).
__device__ inline float wscale_at(const float* ws, bool tile, int64_t o, int64_t kb, int64_t nkb) {
  return tile ? ws[(o / kBlock) * nkb + kb] : ws[o * nkb + kb];
}

__global__ void block_scaled_kernel(const float* __restrict__ xq, const float* __restrict__ xs, int64_t T,
                                    int64_t in, const float* __restrict__ w, const float* __restrict__ ws,
                                    bool tile, int64_t out, float* __restrict__ y) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * out) return;
  const int64_t t = k / out, o = k % out, nkb = in / kBlock;
  const float* a = xq + t * in;
  const float* b = w + o * in;
  float acc = 0.0f;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    double exact = 0.0;  // products of E4M3 x (E4M3 | E2M1) values and their 32-sum are exact in double
    for (int i = 0; i < kBlock; ++i) {
      exact = __dadd_rn(exact, __dmul_rn(static_cast<double>(a[kb * kBlock + i]), static_cast<double>(b[kb * kBlock + i])));
    }
    const float partial = __double2float_rn(exact);
    const float scaled = __fmul_rn(__fmul_rn(partial, xs[t * nkb + kb]), wscale_at(ws, tile, o, kb, nkb));
    acc = __fadd_rn(acc, scaled);
  }
  y[k] = formats::round_to_bf16(acc);
}

// y [T, out]: dot of x row t (in values, at x + t * x_stride + x_off(o)) with weight row o.
// to_bf16: double in index order -> fp32 -> bf16; else the fp32 FMA chain. ws: dequantize first.
__global__ void plain_kernel(const float* __restrict__ x, int64_t T, int64_t in, int64_t x_stride,
                             int64_t rows_per_group, const float* __restrict__ w, const float* __restrict__ ws,
                             bool tile, int64_t out, bool to_bf16, float* __restrict__ y) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * out) return;
  const int64_t t = k / out, o = k % out;
  const float* a = x + t * x_stride + (rows_per_group > 0 ? (o / rows_per_group) * in : 0);
  const float* b = w + o * in;
  const int64_t nkb = in / kBlock;
  if (to_bf16) {
    double acc = 0.0;
    for (int64_t i = 0; i < in; ++i) acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(a[i]), static_cast<double>(b[i])));
    y[k] = formats::round_to_bf16(__double2float_rn(acc));
  } else {
    float acc = 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      const float wv = ws ? __fmul_rn(b[i], wscale_at(ws, tile, o, i / kBlock, nkb)) : b[i];
      acc = __fmaf_rn(a[i], wv, acc);
    }
    y[k] = acc;
  }
}

// A device int, zeroed; read back (synchronizing) by result().
class Status {
 public:
  Status() {
    p_ = static_cast<int*>(device_alloc(sizeof(int)));
    DSV41_CUDA_CHECK(cudaMemsetAsync(p_, 0, sizeof(int)));
  }
  ~Status() { device_free(p_); }
  Status(const Status&) = delete;
  Status& operator=(const Status&) = delete;
  int* get() const { return p_; }
  int result() const {
    int v = 0;
    copy_to_host(&v, p_, sizeof(int));
    return v;
  }

 private:
  int* p_ = nullptr;
};

void check_bf16(const float* x, int64_t n, int* status) {
  if (n == 0) return;
  check_bf16_kernel<<<grid_for(n, kThreads), kThreads>>>(x, n, status);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void block_scaled_linear_async(const float* x, int64_t T, int64_t in, const float* w, const float* wscale,
                               bool tile_scales, int64_t out, float* y, int* status) {
  if (T == 0) return;
  const int64_t nkb = in / kBlock;
  float* xq = static_cast<float*>(device_alloc(static_cast<size_t>(T * in) * sizeof(float)));
  float* xs = static_cast<float*>(device_alloc(static_cast<size_t>(T * nkb) * sizeof(float)));
  act_quant_kernel<<<grid_for(T * nkb, kThreads), kThreads>>>(x, T, in, xq, xs, status);
  DSV41_CUDA_CHECK(cudaGetLastError());
  block_scaled_kernel<<<grid_for(T * out, kThreads), kThreads>>>(xq, xs, T, in, w, wscale, tile_scales, out, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
  device_free(xq);  // stream-ordered: after the kernels
  device_free(xs);
}

int block_scaled_linear(const float* x, int64_t T, int64_t in, const float* w, const float* wscale, bool tile_scales,
                        int64_t out, float* y) {
  if (T == 0) return 0;
  Status s;
  block_scaled_linear_async(x, T, in, w, wscale, tile_scales, out, y, s.get());
  return s.result();
}

void plain_linear_async(const float* x, int64_t T, int64_t in, const float* w, const float* wscale, bool tile_scales,
                        int64_t out, bool to_bf16, float* y, int* status) {
  if (T == 0) return;
  DSV41_CHECK(!to_bf16 || status != nullptr, "plain_linear: a bf16 linear needs a status for its input check");
  if (to_bf16) check_bf16(x, T * in, status);
  plain_kernel<<<grid_for(T * out, kThreads), kThreads>>>(x, T, in, in, 0, w, wscale, tile_scales, out, to_bf16, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

int plain_linear(const float* x, int64_t T, int64_t in, const float* w, const float* wscale, bool tile_scales,
                 int64_t out, bool to_bf16, float* y) {
  if (T == 0) return 0;
  if (!to_bf16) {  // the fp32 product checks nothing: no status to read
    plain_linear_async(x, T, in, w, wscale, tile_scales, out, false, y, nullptr);
    return 0;
  }
  Status s;
  plain_linear_async(x, T, in, w, wscale, tile_scales, out, true, y, s.get());
  return s.result();
}

void grouped_linear(const float* x, int64_t T, int64_t groups, int64_t width, const float* w, int64_t out, float* y) {
  if (T == 0) return;
  plain_kernel<<<grid_for(T * out, kThreads), kThreads>>>(x, T, width, groups * width, out / groups, w, nullptr, false,
                                                          out, /*to_bf16=*/true, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
