#!/usr/bin/env python3
"""bench/torch_eager.py: torch eager equivalents of the kernels dsv41_kernels_bench times.

Same keys and shapes as bench/kernels_bench.cc, bf16 tensors (the production format), CUDA events,
warm-up, a 256 MiB L2 flush before every timed call, median of the repetitions. Writes one line per
case to OUT: "key median_us amount", amount in the unit the C++ table uses (format bytes, or FLOPs
for idx_* and attn_*), so run.sh prints the speed-up of the cuda/ kernel over torch.

These are plain eager formulations (what a port would write first), not bit-exact with the
reference: they are speed baselines only.
Usage: python3 bench/torch_eager.py OUT [--budget-ms 2000]
"""
import sys
import time

import torch

dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def bench(fn, budget_ms):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = (time.perf_counter() - t0) * 1e3
    reps = int(min(50, max(3, budget_ms / max(one, 1e-3))))
    for _ in range(2 if one < 200 else 0):
        fn()
    times = []
    for i in range(reps):
        flush.fill_(i & 0xFF)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def fp8_pack(x):  # [T, 512] bf16 -> [T, 528] bytes: E4M3 codes, UE8M0 scale per 32 (ceil)
    T = x.shape[0]
    xb = x.float().view(T, 16, 32)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    e = torch.ceil(torch.log2(amax / 448.0))
    codes = (xb / torch.exp2(e)).to(torch.float8_e4m3fn).view(torch.uint8).view(T, 512)
    scales = (e.view(T, 16) + 127).clamp(0, 254).to(torch.uint8)
    return torch.cat([codes, scales], 1)


E2M1_BOUNDS = None


def fp4_pack(x):  # [T, 512] bf16 -> [T, 288] bytes: E2M1 nibbles, E4M3 scale per 16
    global E2M1_BOUNDS
    if E2M1_BOUNDS is None:
        E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=dev)
    T = x.shape[0]
    xb = x.float().view(T, 32, 16)
    s = (xb.abs().amax(-1, keepdim=True) / 6.0).to(torch.float8_e4m3fn)
    sf = s.float().clamp_min(2.0**-9)
    y = xb / sf
    mag = torch.bucketize(y.abs(), E2M1_BOUNDS).to(torch.uint8)
    code = (mag | ((y < 0).to(torch.uint8) << 3)).view(T, 256, 2)
    packed = code[..., 0] | (code[..., 1] << 4)
    return torch.cat([packed, s.view(torch.uint8).view(T, 32)], 1)


def main():
    out_path = sys.argv[1]
    budget = float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--budget-ms" else 2000.0
    torch.manual_seed(0)
    res = []

    def case(key, fn, amount):
        try:
            us = bench(fn, budget)
            res.append((key, us, amount))
            print(f"{key:14s} {us:12.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001 (a case that cannot run is reported, the rest go on)
            print(f"{key:14s} FAILED: {e}", flush=True)
        torch.cuda.empty_cache()

    for T, key in ((1 << 21, "fp8_pack_2M"), (64, "fp8_pack_64")):
        x = torch.randn(T, 512, device=dev, dtype=torch.bfloat16)
        case(key, lambda: fp8_pack(x), T * (1024 + 528))
    for T, key in ((1 << 21, "fp4_pack_2M"), (64, "fp4_pack_64")):
        x = torch.randn(T, 512, device=dev, dtype=torch.bfloat16)
        case(key, lambda: fp4_pack(x), T * (1024 + 288))
        del x

    def indexer(T, N, key):
        q = torch.randn(T * 32, 128, device=dev, dtype=torch.bfloat16)
        k = torch.randn(N, 128, device=dev, dtype=torch.bfloat16)
        w = torch.randn(T, 32, 1, device=dev, dtype=torch.bfloat16)

        def fn():
            logits = (q @ k.t()).view(T, 32, N)
            return (torch.relu(logits) * w).sum(1)

        case(key, fn, 2.0 * T * 32 * 128 * N)

    indexer(64, 16384, "idx_decode")
    indexer(4096, 16384, "idx_prefill")

    s = torch.randn(64, 16384, device=dev)
    case("topk_decode", lambda: torch.topk(s, 512, dim=-1, sorted=False), 4 * 64 * 16384 + 4 * 64 * 512)
    s2 = torch.randn(64, 262144, device=dev)
    case("pool_decode", lambda: torch.topk(s2.view(64, 32768, 8).amax(-1), 2048, dim=-1, sorted=False),
         5 * 64 * 262144)

    def attention(B, key):
        T, H, D, K, N = B * 4, 64, 512, 640, B * 2176
        q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(N, D, device=dev, dtype=torch.bfloat16)
        idx = torch.randint(0, N, (T, K), device=dev)

        def fn():
            g = kv[idx]  # [T, K, D]
            sc = torch.bmm(q, g.transpose(1, 2)) * (D ** -0.5)
            p = torch.softmax(sc.float(), -1).to(torch.bfloat16)
            return torch.bmm(p, g)

        case(key, fn, 2.0 * T * H * K * 1024)

    attention(64, "attn_decode")
    attention(1, "attn_b1")
    attention(1024, "attn_prefill")  # T 4096 (the C++ row's index pattern differs; same FLOPs)

    for T, key in ((8192, "mhc_8192"), (64, "mhc_64")):
        C = 5120
        f = torch.randn(T, C, device=dev, dtype=torch.bfloat16)
        r = torch.randn(T, 4, C, device=dev, dtype=torch.bfloat16)
        post = torch.rand(T, 4, device=dev)
        comb = torch.rand(T, 4, 4, device=dev)
        case(key, lambda: (post[..., None] * f.float()[:, None, :]
                           + torch.einsum("tij,tid->tjd", comb, r.float())).to(torch.bfloat16), T * C * 18)
        del f, r

    rows = 48 << 20
    codes = torch.randint(0, 126, (rows, 256), device=dev, dtype=torch.uint8)
    scales = torch.randint(117, 138, (rows, 8), device=dev, dtype=torch.uint8)
    for T, key in ((65536, "engram_65536"), (64, "engram_64")):
        ids = torch.randint(0, rows, (T * 24,), device=dev)

        def fn():
            c = codes.index_select(0, ids).view(torch.float8_e4m3fn).float().view(-1, 8, 32)
            e = torch.exp2(scales.index_select(0, ids).float() - 127).view(-1, 8, 1)
            return (c * e).to(torch.bfloat16).view(T, 24 * 256)

        case(key, fn, T * 24 * (264 + 512 + 8))

    with open(out_path, "w") as f:
        for key, us, amount in res:
            f.write(f"{key} {us:.3f} {amount:.6g}\n")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: {len(res)} cases -> {out_path}")


if __name__ == "__main__":
    main()
