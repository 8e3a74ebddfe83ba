"""The engine's Engram (model.layers.N.engram of the Engram layers): its own token history.

Per step (docs/engram.md, reference/ops/engram.h): the compressed ids of the new tokens
(token_map[id], the default map id * C / V) join the engine's history; each position's n-gram hash
ids over the history (pads before position 0), the table rows looked up (fp8 + e8m0), wkv, then the
gated residual into the hc streams. The history, the token map and the call order are the engine's;
the hash, the fp8 lookup, the linear and the gate run through dsv41.ops (the hash is integer
arithmetic with per-layer multipliers the config derives; the table is fp8, which torch 1.13 cannot
hold).
"""
import numpy as np
import torch
from torch import nn

import dsv41.ops as ops
from engine_attention import Linear, _np


class Engram(nn.Module):
    def __init__(self, weights, layer, c, config, history, pad_id):
        super().__init__()
        p = f"layers.{layer}.engram."
        self.table = ops.linear_weight(weights, p + "embed")
        self.wkv = Linear(weights, p + "wkv")
        self.q_weight, self.k_weight = weights.tensor(p + "q_weight"), weights.tensor(p + "k_weight")
        self.layer, self.c, self.config, self.history = layer, c, config, history   # history: compressed ids
        self.pad_id = pad_id                      # the compressed pad id: token_map[engram_pad_id]
        self.n_cols = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
        self.hash_ids = nn.Identity()             # a tap: the hash ids [T, n_cols] (engram_ids)

    def forward(self, stream, start):
        T = stream.shape[0]
        ids = ops.engram_hash_ids(history=np.array(self.history, np.int64), layer_id=self.layer,
                                  pad_id=self.pad_id, history_first=0, start_pos=start, count=T,
                                  config=self.config)["ids"]
        ids = self.hash_ids(ids)
        rows = ops.engram_lookup(table_weight=self.table["weight"], table_scale=self.table["scale"], ids=ids, head_dim=self.c["engram_head_dim"], n_cols=self.n_cols)["kv"]
        kv = self.wkv(torch.from_numpy(rows))
        return torch.from_numpy(ops.engram_gate_residual(x=_np(stream), kv=_np(kv), q_weight=self.q_weight,
                                                         k_weight=self.k_weight, eps=self.c["norm_eps"])["x"])
