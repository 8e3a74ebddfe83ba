"""The engine's attention of the compressed layers (ratio > 0), with its own compressed caches.

The layer schedule (reference/ops/config.h, layer_schedule): a kv source (Full) owns a compressor,
its compressed KV and index-key caches and an indexer; a later index source (Reindex) runs its own
indexer over its kv owner's index keys (masked by the candidate source's blocks when it comes after
it); the other layers (Reuse) read their kv owner's caches and their top-k owner's selection. Per
step (reference/model/forward_attention.cc, docs/attention.md, docs/indexer.md):
  qr = q_norm(wq_a(x)); q = RoPE(wq_b(qr)); the window ring as every layer (engine_attention.py)
  Full: latents = compressor (ratio > 1: softmax pooling of the fp32 wkv / wgate rows of each group,
        the pending group kept; ratio 1: wkv(x)), then compressor.norm;
        index keys = RoPE(k_norm(indexer.wk(latent))) at the groups' first positions -> index_keys
  Full / Reindex: qi = QDQ(RoPE(indexer.wq_b(qr))); weights = index_weights(weights_proj(x));
        scores over the owner's index keys up to each row's reach; the candidate source's block
        mask (candidate_blocks), or a later index source's scores masked by it; top-k
  the roped latents -> compressed_kv; attention over the window rows then the top-k owner's
  selection of the owner's compressed rows, with the sink; inverse RoPE, wo_a, wo_b.

In torch: the schedule, the caches (packed entries per compressed position: the engine's own bytes),
the compressor (port.py), the index scores, candidate blocks, masking and top-k (port.py), the
attention (port.py), the norms. Through dsv41 (torch 1.13 has no float4 / float8): the linears
(dsv41.ops.linear / linear_fp32 for the fp32 compressor weights), RoPE rows, index_weights, the
window/index rows' layout (attention_index_rows) and the cache codecs (dsv41.formats).
"""
import numpy as np
import torch

import dsv41.formats as F
import dsv41.ops as ops
from engine_attention import Linear, WindowAttention, _np
from port import Compressor, Indexer


def _latest(layers, l):
    got = [x for x in layers if x <= l]
    return max(got) if got else -1


class CompressedAttention(WindowAttention):
    """model.layers.N.attn of a compressed layer; `shared` is the engine's per-step state
    ({"topk": {layer: [T, k]}, "candidates": mask}) and `owners` its layers' attention modules."""

    def __init__(self, weights, layer, c, norm, owners, shared):
        super().__init__(weights, layer, c, norm)
        self.c, self.layer, self.ratio = c, layer, c["compress_ratios"][layer]
        self.kv_owner = _latest(c["kv_source_layers"], layer)
        self.topk_owner = _latest(c["index_source_layers"], layer)
        self.full, self.index_source = self.kv_owner == layer, self.topk_owner == layer
        self.candidate_source = layer == c["candidate_source_layer"]
        self.in_pool = self.index_source and 0 <= c["candidate_source_layer"] < layer
        self.owners, self.shared = owners, shared
        p = f"layers.{layer}.attn."
        if self.full:
            self.compressor = Compressor()
            self.comp_fp32 = self.ratio > 1
            self.wkv_c = weights.raw(p + "compressor.wkv.weight") if self.comp_fp32 else Linear(weights, p + "compressor.wkv")
            self.wgate_c = weights.raw(p + "compressor.wgate.weight") if self.comp_fp32 else None
            self.comp_norm = norm(torch.from_numpy(weights.tensor(p + "compressor.norm.weight")), c["norm_eps"])
            self.idx_wk = Linear(weights, p + "indexer.wk")
            self.idx_k_norm = norm(torch.from_numpy(weights.tensor(p + "indexer.k_norm.weight")), c["norm_eps"])
            D = c["head_dim"]
            self.kv_state = np.zeros((self.ratio, D), np.float32)
            self.score_state = np.full((self.ratio, D), -np.inf, np.float32)
            self.compressed, self.index_keys = [], []       # packed entries by compressed position
        if self.index_source:
            self.indexer = Indexer()
            # Taps (identity modules) showing the indexer's internal values: the scores its top-k is
            # taken from, and (the candidate source) the candidate block mask it publishes.
            self.index_scores = torch.nn.Identity()
            if self.candidate_source:
                self.candidates = torch.nn.Identity()
            self.idx_wq_b = Linear(weights, p + "indexer.wq_b")
            self.idx_weights_proj = Linear(weights, p + "indexer.weights_proj")

    def _fp32_linear(self, x, w):
        return ops.linear_fp32(x=_np(x), w={"weight": w})["y"]

    def _latents(self, x, start):
        """(first group, latents [n, D] bf16 after compressor.norm, pre-RoPE)."""
        if self.ratio > 1:
            kv, score = self._fp32_linear(x, self.wkv_c), self._fp32_linear(x, self.wgate_c)
            first, lat, self.kv_state, self.score_state = self.compressor(kv, score, start, self.ratio,
                                                                           self.kv_state, self.score_state)
            lat = torch.from_numpy(lat)
        else:
            first, lat = start, self.wkv_c(x)
        return first, (self.comp_norm(lat) if lat.shape[0] else lat)

    def forward(self, positions, x):
        c, T, H, D, ratio = self.c, x.shape[0], self.H, self.D, self.ratio
        start = int(positions[0])
        end = start + T
        n = end // ratio
        owner = self.owners[self.kv_owner]
        qr = self.q_norm(self.wq_a(x))
        q = self._rope(self.wq_b(qr), H, start)
        kv = torch.from_numpy(F.qdq(F.WINDOW_KV, _np(self._rope(self.kv_norm(self.wkv(x)), 1, start))))
        first_pos = max(0, start - (self.W - 1))
        window = torch.stack([self.ring[p] for p in range(first_pos, start)] + list(kv))
        widx = np.full((T, self.W), -1, dtype=np.int32)
        for t in range(T):
            lo = max(0, start + t - self.W + 1)
            widx[t, :start + t - lo + 1] = np.arange(lo - first_pos, start + t - first_pos + 1)
        latents = (start, torch.zeros(0, D))
        if self.full:
            latents = self._latents(x, start)
        if self.index_source:
            if n == 0:                                   # nothing to select yet: an empty top-k [T, 0]
                empty = self.index_scores(np.zeros((T, 0), np.float32))
                if self.candidate_source:
                    self.candidates(np.zeros((T, 0), np.uint8))
                own = self.indexer(empty, np.zeros(T, np.int64), c["index_topk"]).numpy()
            else:
                g, lat = latents
                if self.full and lat.shape[0]:
                    k = self.idx_k_norm(self.idx_wk(lat))
                    k = torch.from_numpy(ops.rope_rows(x=_np(k), heads=1, first_pos=g * ratio, pos_stride=ratio,
                                                       inverse=False, **self.rope)["x"])
                    self.index_keys += list(F.pack(F.INDEX_KEYS, _np(k)))
                Hi, Di = c["index_n_heads"], c["index_head_dim"]
                qi = self._rope(self.idx_wq_b(qr), Hi, start)
                qi = F.qdq(F.INDEX_KEYS, _np(qi).reshape(T * Hi, Di)).reshape(T, Hi, Di)
                w = ops.index_weights(proj=_np(self.idx_weights_proj(x)), index_head_dim=Di)["weights"]
                reach = np.array([(start + t + 1) // ratio for t in range(T)], dtype=np.int64)
                keys = np.stack(owner.index_keys[:n])
                scores = self.indexer.scores(qi, keys, F.INDEX_KEYS, Di, w, reach)
                if self.candidate_source:
                    self.shared["candidates"] = self.candidates(self.indexer.candidates(
                        scores, reach, c["candidate_topk_blocks"], c["candidate_block_size"]))
                elif self.in_pool:
                    scores = self.indexer.mask_scores(scores, self.shared["candidates"])
                own = self.indexer(self.index_scores(scores), reach, c["index_topk"]).numpy()
            self.shared["topk"][self.layer] = own
        if self.full and latents[1].shape[0]:
            g, lat = latents
            roped = ops.rope_rows(x=_np(lat), heads=1, first_pos=g * ratio, pos_stride=ratio, inverse=False,
                                  **self.rope)["x"]
            self.compressed += list(F.pack(F.COMPRESSED_KV, roped))
        topk = self.shared["topk"][self.topk_owner]
        idxs = ops.attention_index_rows(window=widx, topk=np.ascontiguousarray(topk, dtype=np.int32),
                                        offset=window.shape[0], width=c["index_topk"])["idxs"]
        comp = np.stack(owner.compressed[:n]) if n else np.zeros((0, 0), np.uint8)
        o = self.sparse_attn(_np(q).reshape(T, H, D), _np(window), comp, F.COMPRESSED_KV, D, self.sink, idxs,
                             float(D) ** -0.5)
        o = self._rope(torch.from_numpy(o).reshape(T, H * D), H, start, inverse=True)
        self._write(kv, start)
        return self.wo_b(self.wo_a(o))

    def caches(self, end):
        """{kind: (bytes [n, entry_bytes], positions [n])} of a kv source after the step ending at `end`."""
        def entries(rows, fmt, dim):
            if rows:
                return np.stack(rows), np.arange(len(rows), dtype=np.int64)
            return np.zeros((0, F.pack(fmt, np.zeros((1, dim), np.float32)).shape[1]), np.uint8), np.zeros(0, np.int64)

        out = {"compressed_kv": entries(self.compressed, F.COMPRESSED_KV, self.D),
               "index_keys": entries(self.index_keys, F.INDEX_KEYS, self.c["index_head_dim"])}
        if self.ratio > 1:
            pend = end % self.ratio
            rows = np.concatenate([self.kv_state[:pend], self.score_state[:pend]], axis=1).astype("<f4")
            out["compressor"] = (rows.view(np.uint8).reshape(pend, 8 * self.D), np.arange(end - pend, end, dtype=np.int64))
        return out
