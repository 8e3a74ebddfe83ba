#!/usr/bin/env python3
"""bench/index_select_torch.py: torch eager baselines of dsv41_index_select_bench's shapes (same call).

The indexer as an eager port writes it (the official Indexer.forward's formulation on bf16 tensors:
scores = sum_h relu(q_h . k) * w_h over a [T, H, N] product, -inf past each row's reach, topk 512;
the candidate source also takes 8-key block maxima and their top 2048), decode T 64 x N 16384 and
prefill T 4096 x N 2048 (H 32, d 128). A speed reference, not the op (no FP4 keys, bf16 throughout).
Median of CUDA-event timings after a 256 MiB L2 flush. --long adds the million-token decode,
T 64 x N 2^20 (a [T, H, N] bf16 product of 4 GiB), dsv41_index_select_bench --only long's shape.
Usage: python3 bench/index_select_torch.py [--long]
"""
import sys

import torch

from torch_timing import bench, dev  # the shared timing loop (median us after an L2 flush)


def indexer(q, k, w, reach, source):
    s = torch.einsum("thd,nd->thn", q, k)  # [T, H, N] bf16
    s = (torch.relu(s) * w[:, :, None]).sum(dim=1)  # [T, N]
    n = k.shape[0]
    s = s.masked_fill(torch.arange(n, device=dev)[None, :] >= reach[:, None], float("-inf"))
    if source:
        blocks = s.view(s.shape[0], -1, 8).amax(dim=2)
        torch.topk(blocks, min(2048, blocks.shape[1]), dim=1)
    return torch.topk(s, 512, dim=1).indices


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    g = torch.Generator(device=dev).manual_seed(1)
    shapes = [("decode", 64, 16384, False), ("prefill", 4096, 2048, True)]
    if "--long" in sys.argv[1:]:
        shapes.append(("long", 64, 1 << 20, False))
    for name, T, n, prefill in shapes:
        q = torch.randn(T, 32, 128, device=dev, generator=g).to(torch.bfloat16)
        k = torch.randn(n, 128, device=dev, generator=g).to(torch.bfloat16)
        w = torch.randn(T, 32, device=dev, generator=g).to(torch.bfloat16)
        t = torch.arange(T, device=dev)
        reach = (t + 1) * n // T if prefill else torch.full((T,), n, device=dev)
        for source in (False, True):
            us = bench(lambda: indexer(q, k, w, reach, source))
            print(f"torch eager {name:8s} {'source' if source else 'plain':6s} T {T:5d} N {n:6d}  {us:9.1f} us")


if __name__ == "__main__":
    main()
