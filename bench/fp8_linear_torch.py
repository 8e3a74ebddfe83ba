#!/usr/bin/env python3
"""bench/fp8_linear_torch.py: torch eager baselines of dsv41_fp8_linear_bench's shapes (same call).

Per (M, K, N), median of CUDA-event timings after a 256 MiB L2 flush (as bench/torch_eager.py):
  scaled_mm   torch._scaled_mm, E4M3 x E4M3 -> bf16 with one scale per tensor (cuBLASLt's fp8 GEMM:
              a coarser scaling than the checkpoint's 32-blocks, so a speed reference, not the op)
  bf16        x_bf16 @ w_bf16.T of already dequantised operands (what an eager port without fp8
              kernels runs; the dequantisation itself not timed)
and the achievable fp8 rate: scaled_mm at 8192^3.
Usage: python3 bench/fp8_linear_torch.py
"""
import torch

from torch_timing import bench, dev  # the shared timing loop (median us after an L2 flush)


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    one = torch.ones((), device=dev)
    for M, K, N in [(64, 5120, 24576), (4096, 5120, 24576), (64, 24576, 5120), (4096, 24576, 5120),
                    (8192, 8192, 8192)]:
        x = torch.randn(M, K, device=dev).to(torch.float8_e4m3fn)
        w = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn)
        flops = 2.0 * M * N * K
        try:
            us = bench(lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            print(f"torch scaled_mm M{M} K{K} N{N} {us:10.1f} us {flops / us / 1e6:8.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"torch scaled_mm M{M} K{K} N{N} FAILED: {e}", flush=True)
        if M * N * K < 8192 ** 3:
            xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
            us = bench(lambda: xb @ wb.t())
            print(f"torch bf16      M{M} K{K} N{N} {us:10.1f} us {flops / us / 1e6:8.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
