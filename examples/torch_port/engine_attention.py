"""The engine's own attention of the window-only layers (compress ratio 0); the base of every layer's.

Per step of T tokens at positions start .. start + T - 1 (docs/attention.md, reference/model/
forward_attention.cc): q = wq_b(q_norm(wq_a(x))) with RoPE; kv = kv_norm(wkv(x)) with RoPE, then the
window_kv format's quantize-dequantize; each query attends the window positions p - W + 1 .. p (the
ring's rows before the step, then the step's own) with the per-head sink (port.py's SparseAttention);
the output gets the inverse RoPE, then wo_a (grouped, bf16) and wo_b. A compressed layer (ratio > 0,
engine_compressed.py) builds on this class: the same linears and window ring, its RoPE with
compress_rope_theta and YaRN.

In torch: the ring (the engine's own cache: a dict position -> row, dumped as the packed window_kv
entries in ascending position order), the window selection, the attention with sink (port.py), the
normalisations. Through dsv41 (torch 1.13 has no float8): the fp8 / bf16 linears (dsv41.ops.linear,
grouped_linear), the RoPE rows (dsv41.ops.rope_rows) and the fp8 cache codec (dsv41.formats).
"""
import numpy as np
import torch
from torch import nn

import dsv41.formats as F
import dsv41.ops as ops
from port import SparseAttention


def _np(t):
    return np.ascontiguousarray(t.numpy() if isinstance(t, torch.Tensor) else t, dtype=np.float32)


class Linear(nn.Module):
    """A checkpoint linear as stored (fp8 + e8m0 scales, or bf16), run by dsv41.ops (bf16 out)."""

    def __init__(self, weights, prefix, groups=None):
        super().__init__()
        self.w = ops.linear_weight(weights, prefix)
        self.groups = groups

    def forward(self, x):
        if self.groups:
            return torch.from_numpy(ops.grouped_linear(x=_np(x), w=self.w, groups=self.groups)["y"])
        return torch.from_numpy(ops.linear(x=_np(x), w=self.w)["y"])


class WindowAttention(nn.Module):
    """model.layers.N.attn of a window-only layer (vLLM's names for its linears)."""

    def __init__(self, weights, layer, c, norm):
        super().__init__()
        ratio = c["compress_ratios"][layer]
        p = f"layers.{layer}.attn."
        self.wq_a, self.wq_b, self.wkv = Linear(weights, p + "wq_a"), Linear(weights, p + "wq_b"), Linear(weights, p + "wkv")
        self.wo_a, self.wo_b = Linear(weights, p + "wo_a", groups=c["o_groups"]), Linear(weights, p + "wo_b")
        self.q_norm = norm(torch.from_numpy(weights.tensor(p + "q_norm.weight")), c["norm_eps"])
        self.kv_norm = norm(torch.from_numpy(weights.tensor(p + "kv_norm.weight")), c["norm_eps"])
        self.sink = weights.tensor(p + "attn_sink")
        self.sparse_attn = SparseAttention()
        self.H, self.D, self.W = c["n_heads"], c["head_dim"], c["window_size"]
        self.rope = dict(rope_dim=c["rope_head_dim"], max_seq_len=c["max_seq_len"], factor=c["rope_factor"],
                         beta_fast=c["beta_fast"], beta_slow=c["beta_slow"],
                         original_seq_len=c["original_seq_len"] if ratio > 0 else 0,   # window-only: no YaRN
                         base=c["compress_rope_theta"] if ratio > 0 else c["rope_theta"])
        self.ring = {}                                       # position -> window_kv row [D] (after the QDQ)

    def _rope(self, x, heads, start, inverse=False):
        return torch.from_numpy(ops.rope_rows(x=_np(x), heads=heads, first_pos=start, pos_stride=1, inverse=inverse,
                                              **self.rope)["x"])

    def forward(self, positions, x):
        T, H, D, W = x.shape[0], self.H, self.D, self.W
        start = int(positions[0])
        kv = self._rope(self.kv_norm(self.wkv(x)), 1, start)                      # [T, D] bf16
        kv = torch.from_numpy(F.qdq(F.WINDOW_KV, _np(kv)))
        q = self._rope(self.wq_b(self.q_norm(self.wq_a(x))), H, start)           # [T, H*D] bf16
        first = max(0, start - (W - 1))                                           # the oldest row a query reads
        rows = [self.ring[p] for p in range(first, start)] + list(kv)             # window rows, position first..
        window = torch.stack(rows)                                                # [r + T, D]
        idxs = np.full((T, W), -1, dtype=np.int32)
        for t in range(T):
            p = start + t
            lo = max(0, p - W + 1)
            idxs[t, :p - lo + 1] = np.arange(lo - first, p - first + 1)
        o = self.sparse_attn(_np(q).reshape(T, H, D), _np(window), np.zeros((0, 0), np.uint8), F.WINDOW_KV, D,
                             self.sink, idxs, float(D) ** -0.5)                   # [T, H, D] bf16
        o = self._rope(torch.from_numpy(o).reshape(T, H * D), H, start, inverse=True)
        self._write(kv, start)
        return self.wo_b(self.wo_a(o))

    def _write(self, kv, start):
        for t in range(kv.shape[0]):
            self.ring[start + t] = kv[t]
        for p in [p for p in self.ring if p <= start + kv.shape[0] - 1 - self.W]:
            del self.ring[p]                                                      # the ring keeps W positions

    def cache(self):
        """(packed window_kv entries [n, entry_bytes] in ascending position order, positions [n])."""
        pos = sorted(self.ring)
        rows = np.stack([_np(self.ring[p]) for p in pos])
        return F.pack(F.WINDOW_KV, rows), np.array(pos, dtype=np.int64)
