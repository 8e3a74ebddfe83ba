"""bench/torch_timing.py: the timing loop of the torch eager baselines (bench/*_torch.py).

bench(fn) runs fn once to warm up, once to size the repetitions to about budget_ms (5 to 100 of
them), then times each repetition with CUDA events after overwriting a 256 MiB buffer (an L2
flush); it returns the median in microseconds. `dev` is the device the scripts allocate on.
bench/torch_eager.py keeps its own loop (fewer, longer repetitions with warm-ups of their own).
"""
import time

import torch

dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def bench(fn, budget_ms=1500):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = (time.perf_counter() - t0) * 1e3
    reps = int(min(100, max(5, budget_ms / max(one, 1e-3))))
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
