#!/usr/bin/env python3
"""bench/sparse_attn_torch.py: torch eager baselines of dsv41_sparse_attn_bench's shapes (same call).

Sparse attention as an eager port writes it (bench/torch_eager.py's formulation: gather the KV rows,
bmm, fp32 softmax, bf16 probabilities, bmm; no sink, random indices: a speed reference, not the op),
decode B 64 and B 1 (s_q 4) and prefill T 4096 (h 64, k 640, d 512), and the achievable bf16 rate:
a bf16 matmul 8192^3. Median of CUDA-event timings after a 256 MiB L2 flush.
Usage: python3 bench/sparse_attn_torch.py
"""
import torch

from torch_timing import bench, dev  # the shared timing loop (median us after an L2 flush)


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    us = bench(lambda: a @ b)
    print(f"torch bf16 matmul 8192^3 {us:10.1f} us {2.0 * 8192 ** 3 / us / 1e6:8.1f} TFLOP/s (peak)", flush=True)
    del a, b
    for name, B in (("decode B64", 64), ("decode B1", 1), ("prefill", 1024)):
        T, H, D, K, N = B * 4, 64, 512, 640, B * 2176
        q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(N, D, device=dev, dtype=torch.bfloat16)
        idx = torch.randint(0, N, (T, K), device=dev)

        def fn():
            g = kv[idx]  # [T, K, D]
            sc = torch.bmm(q, g.transpose(1, 2)) * (D ** -0.5)
            p = torch.softmax(sc.float(), -1).to(torch.bfloat16)
            return torch.bmm(p, g)

        us = bench(fn)
        print(f"torch eager {name:10s} T {T:5d} {us:10.1f} us {2.0 * T * H * K * 1024 / us / 1e6:8.1f} TFLOP/s",
              flush=True)
        del q, kv, idx
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
