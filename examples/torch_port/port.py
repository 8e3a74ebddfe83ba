"""An example port: the sparse-attention components of DeepSeek-V4.1-Flash in torch (issue 15).

Written from dsv41's docs, not by calling dsv41 for the math (docs/indexer.md, docs/attention.md,
docs/formats.md, docs/numerics.md): the CSA2 indexer (scores, candidate blocks, top-k with the tie
rule), the compressor (softmax pooling of ratio groups with the pending state) and the sparse
attention with its sink. torch 1.13 has no float8 / float4 dtypes, so the packed caches are
decoded with dsv41's format codecs (dsv41.formats.unpack), the only dsv41 call here.

The modules are named like the official code (layers.N.attn.indexer, layers.N.attn.compressor),
so dsv41.torch_hooks finds them. TorchPort.ops() gives them to dsv41.Model(..., port=...): the
reference model's orchestration runs the port's components (docs/python.md, "A port's ops in the
reference model"), as a port engineer runs a half-finished port against the rest of the model.

The port sums in its own order (torch einsum, a one-pass softmax instead of the reference's
64-index blocks), so it claims "order-variant" (docs/conform.md, "Claims").

--bug NAME plants a bug of dsv41's self-test zoo (docs/selftest.md) in the port:
    sink_in_numerator        sparse_attn: the sink's softmax share added to every output channel
    newest_block_not_pinned  candidate blocks chosen by score alone (the newest block not kept)
    compressor_partial_group_lost  a prefill chunk starting mid-group resets the pending state
"""
import numpy as np
import torch
from torch import nn

import dsv41.formats

BUGS = ("sink_in_numerator", "newest_block_not_pinned", "compressor_partial_group_lost")


def bf16(t):
    """Round fp32 to bf16 (nearest even) and back: the rounding point of every bf16 tensor."""
    return t.to(torch.bfloat16).to(torch.float32)


def t32(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32)


def decode_cache(data, fmt, dim):
    """Packed cache entries [n, entry_bytes] -> [n, dim] float32 (dsv41's codec: torch has no fp4/fp8)."""
    if data.shape[0] == 0:
        return torch.zeros(0, dim)
    return torch.from_numpy(dsv41.formats.unpack(fmt, data, dim))


class Indexer(nn.Module):
    """layers.N.attn.indexer (docs/indexer.md). forward() is the top-k, as in the official code."""

    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug

    def scores(self, q, keys, keys_format, keys_dim, weights, reach):
        q, w = t32(q), t32(weights)                        # [T, Hi, Di] bf16, [T, Hi] bf16
        k = decode_cache(keys, keys_format, keys_dim)      # [N, Di] FP4 values
        # bf16(dot_f64_f32): FP4 operands, the double sum is exact; round to fp32, then bf16.
        dots = bf16(torch.einsum("thd,nd->thn", q.double(), k.double()).float())
        prod = bf16(torch.clamp(dots, min=0.0) * w[:, :, None])  # relu, * weights, bf16
        acc = torch.zeros(prod.shape[0], prod.shape[2])
        for h in range(prod.shape[1]):                     # fp32 sum in head order, one rounding
            acc = acc + prod[:, h, :]
        s = bf16(acc)
        n = torch.arange(s.shape[1])[None, :]
        s[n >= torch.from_numpy(np.asarray(reach))[:, None]] = float("-inf")
        return s.numpy()

    def candidates(self, scores, reach, topk_blocks, block_size):
        s = t32(scores)                                    # [T, N]
        T, N = s.shape
        nb = (N + block_size - 1) // block_size
        pad = torch.full((T, nb * block_size), float("-inf"))
        pad[:, :N] = s
        block = pad.view(T, nb, block_size).amax(dim=2)    # block score = max of its positions
        if self.bug != "newest_block_not_pinned":
            for t in range(T):
                if reach[t] > 0:                           # the newest block is always kept
                    block[t, (int(reach[t]) - 1) // block_size] = float("inf")
        k = min(topk_blocks, nb)
        order = torch.sort(block, dim=1, descending=True, stable=True).indices[:, :k]  # ties: lower block
        mask = torch.zeros(T, nb * block_size, dtype=torch.uint8)
        for t in range(T):
            for b in order[t].tolist():
                if block[t, b] > float("-inf"):
                    mask[t, b * block_size:(b + 1) * block_size] = 1
        return mask[:, :N].numpy()

    def mask_scores(self, scores, mask):
        s = t32(scores).clone()
        s[torch.from_numpy(mask) == 0] = float("-inf")
        return s.numpy()

    def forward(self, scores, reach, k):
        s = t32(scores)                                    # [T, N]
        kk = min(k, s.shape[1])
        pick = torch.sort(s, dim=1, descending=True, stable=True).indices[:, :kk]  # ties: lower position
        pick = torch.sort(pick, dim=1).values
        pick[pick >= torch.from_numpy(np.asarray(reach))[:, None]] = -1
        return pick.to(torch.int32)


class Compressor(nn.Module):
    """layers.N.attn.compressor: softmax pooling of each ratio group (docs/attention.md, "Compressor")."""

    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug

    @staticmethod
    def pool(kv_rows, score_rows):
        """[ratio, D] each -> bf16 [D]: per channel m = max s, e = exp(s - m), w = e / z, sum kv * w left to right."""
        m = score_rows.amax(dim=0)
        e = torch.exp((score_rows - m).double()).float()   # a correctly rounded fp32 exp
        z = torch.zeros_like(m)
        for t in range(e.shape[0]):
            z = z + e[t]
        acc = torch.zeros_like(m)
        for t in range(e.shape[0]):
            acc = acc + kv_rows[t] * (e[t] / z)
        return bf16(acc)

    def forward(self, kv, score, start_pos, ratio, kv_state, score_state):
        kv, score = t32(kv), t32(score)                    # [T, D] fp32
        ks, ss = t32(kv_state).clone(), t32(score_state).clone()  # [ratio, D]
        T = kv.shape[0]
        end = start_pos + T
        if self.bug == "compressor_partial_group_lost" and start_pos % ratio != 0 and T > 1:
            ss[:] = float("-inf")                          # the bug: the pending group is forgotten
            ks[:] = 0
        first, last = start_pos // ratio, end // ratio
        latents = []
        for g in range(first, last):
            rows_kv, rows_s = [], []
            for t in range(ratio):
                p = g * ratio + t
                if g * ratio >= start_pos:                 # the whole group is in this call
                    rows_kv.append(kv[p - start_pos])
                    rows_s.append(score[p - start_pos])
                else:                                      # started earlier: its slots hold the first tokens
                    if p >= start_pos:
                        ks[t], ss[t] = kv[p - start_pos], score[p - start_pos]
                    rows_kv.append(ks[t])
                    rows_s.append(ss[t])
            latents.append(self.pool(torch.stack(rows_kv), torch.stack(rows_s)))
        for p in range(max(start_pos, last * ratio), end):  # the trailing partial group waits
            ks[p % ratio], ss[p % ratio] = kv[p - start_pos], score[p - start_pos]
        latent = torch.stack(latents) if latents else torch.zeros(0, kv.shape[1])
        return first, latent.numpy(), ks.numpy(), ss.numpy()


class SparseAttention(nn.Module):
    """layers.N.attn.sparse_attn: attention over selected rows with a per-head sink (docs/attention.md)."""

    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug

    def forward(self, q, window_kv, compressed, compressed_format, compressed_dim, sink, idxs, softmax_scale):
        q = t32(q)                                         # [T, H, D] bf16
        kv = t32(window_kv)                                # [W, D] bf16
        if compressed.size:
            kv = torch.cat([kv, decode_cache(compressed, compressed_format, compressed_dim)])
        idx = torch.from_numpy(np.asarray(idxs)).long()    # [T, K], -1 none
        valid = idx >= 0
        rows = kv[idx.clamp(min=0)] * valid[:, :, None]    # [T, K, D], a -1 row is zero
        logits = torch.einsum("thd,tkd->thk", q, rows) * softmax_scale
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        m = torch.clamp(logits.amax(dim=2), min=-1e30)     # running max starts at -1e30
        p = torch.exp(logits - m[:, :, None])
        sink_share = torch.exp(t32(sink)[None, :] - m)     # the sink: in the denominator only
        denom = p.double().sum(dim=2).float() + sink_share
        num = torch.einsum("thk,tkd->thd", bf16(p), rows)
        if self.bug == "sink_in_numerator":
            num = num + sink_share[:, :, None]
        return bf16(num / denom[:, :, None]).numpy()


class Attention(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.indexer = Indexer(bug)
        self.compressor = Compressor(bug)
        self.sparse_attn = SparseAttention(bug)


class Layer(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.attn = Attention(bug)


class TorchPort(nn.Module):
    """The port: one Layer per model layer (DSpark blocks included), modules named as officially."""

    def __init__(self, n_layers, bug=None):
        super().__init__()
        if bug is not None and bug not in BUGS:
            raise ValueError(f"--bug {bug}: not a bug of this port (known: {', '.join(BUGS)})")
        self.bug = bug
        self.layers = nn.ModuleList(Layer(bug) for _ in range(n_layers))

    def ops(self):
        """{op: callable(layer, **arrays)} for dsv41.Model(..., port=...) (python/port_ops.h)."""
        L = self.layers
        return {
            "index_scores": lambda layer, **a: L[layer].attn.indexer.scores(**a),
            "candidate_blocks": lambda layer, **a: L[layer].attn.indexer.candidates(**a),
            "mask_scores": lambda layer, **a: L[layer].attn.indexer.mask_scores(**a),
            "index_topk": lambda layer, **a: L[layer].attn.indexer(**a).numpy(),
            "compress": lambda layer, **a: L[layer].attn.compressor(**a),
            "sparse_attn": lambda layer, **a: L[layer].attn.sparse_attn(**a),
        }
