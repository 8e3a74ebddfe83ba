#!/usr/bin/env python3
"""Oracle harness, VARIANT edition (dsv41 scripts/oracle/harness_variant.py).

A copy of ../shared/oracle-harness/harness.py with its constants read from a variant file
(ORACLE_VARIANT=path/to/variant.json): seeds, prompt length, decode steps, the sparse_attn I/O
layers, the token pattern, the number of prefill logits rows kept, and ModelArgs overrides of the
tiny config. Other edits: weights.safetensors is written in every tie rule (the variant's config
changes the weights); descriptions name the variant's lengths. Numerics are untouched.

Original description follows.

Runs the vendored DeepSeek-V4.1-Flash reference (tt-metal's byte-identical copy of upstream
inference/model.py + engram.py, with tt-metal's torch CPU port of kernel.py) on a tiny config that
covers every layer type, and writes golden data:

  $OUT/weights.safetensors   every parameter, model's own names and storage dtypes
  $OUT/config.json           the ModelArgs of the tiny model (same keys as upstream config.json)
  $OUT/kernels.h5            quantizers, GEMMs, sparse_attn, Sinkhorn, RoPE, RMSNorm, Engram layouts
  $OUT/prefill.h5            prefill: tokens, logits, per-layer sublayer outputs, mHC, top-k, caches
  $OUT/prefill_streams.h5    prefill: embedding and the 4-copy residual stream after every block/engram
  $OUT/prefill_attn.h5       prefill: attention/FFN inputs and sparse_attn q/kv/out for a few layers
  $OUT/decode.h5             8 single-token decode steps + DSpark forward_spec at each step
  $OUT/run.log               log
"""

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT") or os.path.join(HERE, "out")
WORK = os.path.join(os.environ.get("TMPDIR", "."), "oracle_work")
os.makedirs(OUT, exist_ok=True)
os.makedirs(WORK, exist_ok=True)
# top-k tie rule inside the indexers: "torch" = the reference as is (torch.topk on CPU, ties broken however
# the CPU kernel does it); "lowest_index" = among equal scores the lower position wins (stable sort), a
# deterministic rule that a re-implementation can reproduce exactly.
TIE_RULE = os.environ.get("ORACLE_TIE_RULE", "torch")
SUFFIX = "" if TIE_RULE == "torch" else "_lowtie"
_LOG = open(os.path.join(OUT, "run%s.log" % SUFFIX), "w")


def log(*parts):
    s = " ".join(str(p) for p in parts)
    print(s, flush=True)
    _LOG.write(s + "\n")
    _LOG.flush()


import h5py  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(16)
sys.path.insert(0, os.path.join(HERE, "pkg"))
from v41 import engram as E  # noqa: E402
from v41 import kernel_cpu as K  # noqa: E402
from v41 import model as v41  # noqa: E402
from v41 import testing as T  # noqa: E402

SEED = 0
TOKEN_SEED = 1234
PROMPT_LEN = 333
N_DECODE = 8
MAX_FILE = int(15.5 * 2**20)
PREFILL_IO_LAYERS = (0, 2, 6, 8)
# ---- variant edits (everything else in this file is the harness as shipped) ----
VARIANT = json.load(open(os.environ["ORACLE_VARIANT"])) if os.environ.get("ORACLE_VARIANT") else {}
SEED = VARIANT.get("seed", SEED)
TOKEN_SEED = VARIANT.get("token_seed", TOKEN_SEED)
PROMPT_LEN = VARIANT.get("prompt_len", PROMPT_LEN)
N_DECODE = VARIANT.get("n_decode", N_DECODE)
PREFILL_IO_LAYERS = tuple(VARIANT.get("prefill_io_layers", PREFILL_IO_LAYERS))
ARGS_OVERRIDES = {k: (tuple(v) if isinstance(v, list) else v) for k, v in VARIANT.get("args", {}).items()}
# token pattern edits after the random draw: [dst, src, n, xor] copies tokens[src:src+n] ^ xor to dst; [pos, token] sets one
TOKEN_COPIES = VARIANT.get("token_copies", [[200, 10, 10, 0], [300, 40, 6, 1]])
TOKEN_SETS = VARIANT.get("token_sets", [[100, 2], [101, 3]])
LOGITS_ALL_ROWS = VARIANT.get("logits_all_rows", 0)  # 0 = every prompt position; else the last N rows
TOKEN_MAP_MOD = VARIANT.get("token_map_mod", 0)  # 0 = the stub tokenizer's map (id // 2); M = id % M (ModTokenizer)
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32
)
TIMINGS = {}


# ----------------------------------------------------------------------------------------------
# tiny config
# ----------------------------------------------------------------------------------------------
def tiny_args() -> "v41.ModelArgs":
    a = v41.ModelArgs(
        max_batch_size=1,
        max_seq_len=512,
        temperature=0.0,
        dtype="fp8",
        expert_dtype="fp4",
        vocab_size=1024,
        dim=256,
        moe_inter_dim=128,
        n_layers=10,
        n_mtp_layers=1,
        n_heads=4,
        n_routed_experts=6,
        n_shared_experts=1,
        n_activated_experts=3,
        score_func="sqrtsoftplus",
        gate_temp=1.0,
        norm_topk_prob=True,
        route_scale=1.5,
        swiglu_limit=10.0,
        q_lora_rank=128,
        head_dim=128,
        rope_head_dim=32,
        norm_eps=1e-20,
        o_groups=2,
        o_lora_rank=64,
        window_size=64,
        compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0),
        kv_source_layers=(2, 4, 6),
        index_source_layers=(2, 4, 6, 8),
        compress_rope_theta=160000.0,
        original_seq_len=65536,
        rope_theta=10000.0,
        rope_factor=16,
        beta_fast=32,
        beta_slow=1,
        index_n_heads=8,
        index_head_dim=64,
        index_topk=32,
        candidate_source_layer=6,
        candidate_topk_blocks=6,
        candidate_block_size=8,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        engram_layer_ids=(1, 4),
        engram_num_embeddings=(),
        engram_max_ngram_size=4,
        engram_vocab_size=300,
        engram_n_heads=4,
        engram_head_dim=32,
        engram_pad_id=2,
        engram_compressed_vocab_size=512,
        vision_n_layers=0,
        dspark_block_size=5,
        dspark_noise_token_id=1023,
        dspark_target_layer_ids=(7, 8, 9),
        dspark_markov_rank=32,
        dspark_n_routed_experts=4,
        dspark_n_activated_experts=2,
    )
    a = dataclasses.replace(a, **ARGS_OVERRIDES)
    layout = E.EngramLayout.from_args(a)
    rows = tuple(sum(p for per_ngram in layer for p in per_ngram) for layer in layout.primes)
    return dataclasses.replace(a, engram_num_embeddings=rows)


# ----------------------------------------------------------------------------------------------
# HDF5 items
# ----------------------------------------------------------------------------------------------
class Item:
    __slots__ = ("path", "value", "meaning", "attrs", "f32")

    def __init__(self, path, value, meaning, attrs, f32):
        self.path, self.value, self.meaning, self.attrs, self.f32 = path, value, meaning, attrs, f32


def _clone(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.element_size() == 1 and x.dtype not in (torch.uint8, torch.int8, torch.bool):
            # exotic 1-byte dtypes (fp8, e8m0, packed fp4): copy the raw bytes
            return x.contiguous().view(torch.uint8).clone().view(x.dtype)
        return x.clone()
    return x


def _write_array(g, name, arr):
    arr = np.ascontiguousarray(arr)
    if arr.nbytes > 65536:
        g.create_dataset(name, data=arr, compression="gzip", compression_opts=4, shuffle=True)
    else:
        g.create_dataset(name, data=arr)


def write_item(f, it, drop_big_f32=False):
    g = f.require_group(it.path)
    g.attrs["meaning"] = it.meaning
    for k, v in it.attrs.items():
        g.attrs[k] = v
    x = it.value
    if isinstance(x, torch.Tensor):
        t = x.contiguous()
        dt = t.dtype
        g.attrs["torch_dtype"] = str(dt).replace("torch.", "")
        g.attrs["shape"] = np.array(list(t.shape), dtype=np.int64)
        if dt == torch.bfloat16:
            _write_array(g, "bits", t.view(torch.int16).numpy().view(np.uint16))
            if it.f32 and not (drop_big_f32 and t.numel() > 10000):
                _write_array(g, "f32", t.float().numpy())
                g.attrs["layout"] = "bits: uint16 bfloat16 bit patterns; f32: the same values as float32"
            else:
                g.attrs["layout"] = "bits: uint16 bfloat16 bit patterns (float32 copy omitted to keep the file small)"
        elif dt in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
            _write_array(g, "bits", t.view(torch.uint8).numpy())
            if it.f32:
                _write_array(g, "f32", t.float().numpy())
            g.attrs["layout"] = "bits: uint8 raw %s bytes; f32 (if present): decoded values" % g.attrs["torch_dtype"]
        elif dt == torch.float4_e2m1fn_x2:
            b = t.view(torch.uint8).numpy()
            codes = np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)
            _write_array(g, "bits", b)
            _write_array(g, "codes", codes)
            if it.f32:
                _write_array(g, "f32", FP4_VALUES[codes])
            g.attrs["layout"] = (
                "bits: packed bytes as torch stores float4_e2m1fn_x2 (low nibble = even element); "
                "codes: one E2M1 code (0..15, bit3 = sign) per logical element; f32 (if present): decoded"
            )
        elif dt == torch.bool:
            _write_array(g, "value", t.numpy().astype(np.uint8))
            g.attrs["layout"] = "value: bool stored as uint8 0/1"
        elif dt.is_complex:
            _write_array(g, "real", t.real.float().numpy())
            _write_array(g, "imag", t.imag.float().numpy())
            g.attrs["layout"] = "real/imag float32"
        else:
            _write_array(g, "value", t.numpy())
            g.attrs["layout"] = "value: %s" % g.attrs["torch_dtype"]
    else:
        arr = np.asarray(x)
        g.attrs["numpy_dtype"] = str(arr.dtype)
        g.attrs["shape"] = np.array(list(arr.shape), dtype=np.int64)
        _write_array(g, "value", arr)
        g.attrs["layout"] = "value: %s" % arr.dtype


def write_h5(name, items, description, root_attrs=None):
    path = os.path.join(WORK, name)
    for drop in (False, True):
        with h5py.File(path, "w", libver=("earliest", "v110")) as f:
            f.attrs["description"] = description
            f.attrs["producer"] = "dsv41 oracle harness (vendored DeepSeek-V4.1-Flash reference, kernel_cpu)"
            for k, v in (root_attrs or {}).items():
                f.attrs[k] = v
            if drop:
                f.attrs["f32_copies"] = "omitted for bf16 items with more than 10000 elements (file size limit)"
            for it in items:
                write_item(f, it, drop_big_f32=drop)
        size = os.path.getsize(path)
        if size <= MAX_FILE:
            break
        log(f"  {name}: {size} bytes is over the limit; rewriting without big float32 copies")
    shutil.copy(path, os.path.join(OUT, name))
    log(f"  wrote {name}: {len(items)} items, {os.path.getsize(path)} bytes")


# ----------------------------------------------------------------------------------------------
# Recorder: hooks and spies push clones here
# ----------------------------------------------------------------------------------------------
class Recorder:
    def __init__(self, n_layers):
        self.n_layers = n_layers
        self.items = {}
        self.seen = set()
        self.enabled = True
        self.stage = "prefill"
        self.phase = "prefill"
        self.layer = None
        self.topk_log = None
        self.last_norm = None
        self.markov_calls = 0
        self.kv_capture = True
        self.in_indexer = False

    def lname(self, layer=None):
        L = self.layer if layer is None else layer
        if L is None:
            return "nolayer"
        return f"layer{L:02d}" if L < self.n_layers else f"dspark{L - self.n_layers}"

    def file_for(self, kind):
        if self.stage == "prefill":
            if kind == "stream":
                return "prefill_streams.h5"
            if kind == "io":
                return "prefill_attn.h5" if self.layer in PREFILL_IO_LAYERS else None
            return "prefill.h5"
        if self.stage == "prefill_dspark":
            return "prefill.h5"
        if kind == "io" and not (self.layer in PREFILL_IO_LAYERS or (self.layer or 0) >= self.n_layers):
            return None
        return "decode.h5"

    def put(self, fname, name, x, meaning, f32=True, **attrs):
        if not self.enabled or fname is None or x is None:
            return
        path = f"{self.phase}/{name}" if self.phase else name
        if path in self.seen:
            k = 1
            while f"{path}__{k}" in self.seen:
                k += 1
            path = f"{path}__{k}"
        self.seen.add(path)
        self.items.setdefault(fname, []).append(Item(path, _clone(x), meaning, attrs, f32))


REC = None  # set in main
_HOOK_ERRORS = {}


def guard(fn):
    """Recording must never break the reference forward: log the first failure of each hook and go on."""
    def wrapped(*a, **k):
        try:
            return fn(*a, **k)
        except Exception:
            key = fn.__name__
            if key not in _HOOK_ERRORS:
                _HOOK_ERRORS[key] = traceback.format_exc()
                log(f"  HOOK {key} FAILED (phase {REC.phase if REC else None}):\n{_HOOK_ERRORS[key]}")
            return None

    wrapped.__name__ = fn.__name__
    return wrapped

# spies on the module-global kernels / tensor method; numerics untouched
_ORIG_SPARSE_ATTN = v41.sparse_attn
_ORIG_SELECT_CANDIDATES = v41.select_candidate_blocks
_ORIG_TOPK = torch.Tensor.topk


def _sparse_attn_spy(q, kv, attn_sink, topk_idxs, softmax_scale):
    out = _ORIG_SPARSE_ATTN(q, kv, attn_sink, topk_idxs, softmax_scale)
    _record_sparse(q, kv, topk_idxs, out, softmax_scale)
    return out


@guard
def _record_sparse(q, kv, topk_idxs, out, softmax_scale):
    r = REC
    if r is not None and r.enabled:
        ln = r.lname()
        r.put(
            r.file_for("main"),
            f"{ln}/attn_topk_idxs",
            topk_idxs,
            "int32 [b, m, k] indices handed to sparse_attn: sliding-window slots first, then compressed "
            "positions + offset (offset = window part length: seqlen in prefill, window_size in decode); -1 = masked",
        )
        fio = r.file_for("io")
        r.put(fio, f"{ln}/sparse_q", q, "sparse_attn query [b, m, heads, head_dim] bf16, after RoPE on the last rope_head_dim channels")
        if r.kv_capture:
            r.put(fio, f"{ln}/sparse_kv", kv, "sparse_attn K=V rows [b, n, head_dim] bf16: window KV (FP8 QDQ) then compressed KV (FP4 QDQ)")
        r.put(fio, f"{ln}/sparse_out", out, "sparse_attn output [b, m, heads, head_dim] bf16, before the inverse RoPE", softmax_scale=float(softmax_scale))


def _select_candidates_spy(logits, compress_lens, topk_blocks, block_size):
    mask = _ORIG_SELECT_CANDIDATES(logits, compress_lens, topk_blocks, block_size)
    _record_candidates(mask, compress_lens, topk_blocks, block_size)
    return mask


@guard
def _record_candidates(mask, compress_lens, topk_blocks, block_size):
    r = REC
    if r is not None and r.enabled:
        ln = r.lname()
        r.put(r.file_for("main"), f"{ln}/candidates", mask,
              "candidate mask published by the candidate source: bool [b, s, n_compressed] (True = position inside a kept block)",
              topk_blocks=int(topk_blocks), block_size=int(block_size))
        cl = compress_lens if isinstance(compress_lens, torch.Tensor) else torch.tensor([compress_lens])
        r.put(r.file_for("main"), f"{ln}/candidates_compress_lens", cl,
              "reach (number of visible compressed positions) per query, as passed to select_candidate_blocks")


class _TopK:
    def __init__(self, values, indices):
        self.values, self.indices = values, indices


def _stable_topk(t, k, dim=-1, largest=True, sorted=True):
    assert largest
    vals, idx = torch.sort(t, dim=dim, descending=True, stable=True)
    return _TopK(vals.narrow(dim, 0, k), idx.narrow(dim, 0, k))


def _topk_spy(self, *args, **kwargs):
    r = REC
    if TIE_RULE == "lowest_index" and r is not None and r.in_indexer:
        res = _stable_topk(self, *args, **kwargs)
    else:
        res = _ORIG_TOPK(self, *args, **kwargs)
    _record_topk(self, args, kwargs, res)
    return res


@guard
def _record_topk(t, args, kwargs, res):
    r = REC
    if r is not None and r.enabled and r.topk_log is not None:
        r.topk_log.append((t.detach().clone(), args, dict(kwargs), res.indices.detach().clone()))


v41.sparse_attn = _sparse_attn_spy
v41.select_candidate_blocks = _select_candidates_spy
torch.Tensor.topk = _topk_spy


def install_hooks(model, args, rec):
    M = "main"

    @guard
    def embed_hook(m, a, out):
        rec.put(rec.file_for("stream"), "embed", out,
                "token embedding rows [b, s, dim] bf16; the stream entering layer 0 is this row copied into hc_mult copies")

    model.embed.register_forward_hook(embed_hook)

    @guard
    def norm_hook(m, a, out):
        rec.last_norm = out.detach().clone()
        rec.put(rec.file_for(M), "final_norm_out", out,
                "model.norm output [b, s, dim] bf16 = norm(hc_pre(last stream, last ffn pre)); the head input")

    model.norm.register_forward_hook(norm_hook)

    @guard
    def record_mixes(tag, pre, post, comb):
        ln = rec.lname()
        f = rec.file_for(M)
        rec.put(f, f"{ln}/hc_{tag}_pre", pre, "fp32 [b, s, hc]: pre mix computed from this sublayer's input stream (applied one sublayer later)")
        rec.put(f, f"{ln}/hc_{tag}_post", post, "fp32 [b, s, hc]: post mix of this sublayer")
        rec.put(f, f"{ln}/hc_{tag}_comb", comb, "fp32 [b, s, hc, hc]: Sinkhorn-normalised comb [i][j] of this sublayer")

    @guard
    def bpost(m, a, out):
        x, pre_mix = out
        ln = rec.lname()
        rec.put(rec.file_for("stream"), f"{ln}/out_stream", x,
                "residual stream after this block [b, s, hc_mult, dim] bf16 (for a DSpark prefill the block returns its input)")
        rec.put(rec.file_for(M), f"{ln}/next_pre", pre_mix,
                "fp32 [b, s, hc_mult]: the FFN's hc 'pre' mix, handed to the next block's attention (or to the final hc_pre)")

    @guard
    def attn_pre(m, a):
        rec.put(rec.file_for("io"), f"{rec.lname()}/attn_in", a[0],
                "attention input = attn_norm(hc_pre(stream, pre)) [b, s, dim] bf16 (DSpark prefill: the raw draft stream)")

    @guard
    def attn_post(m, a, out):
        rec.put(rec.file_for(M), f"{rec.lname()}/attn_out", out, "attention sublayer output [b, s, dim] bf16 (after wo_b)")

    @guard
    def ffn_pre(m, a):
        rec.put(rec.file_for("io"), f"{rec.lname()}/ffn_in", a[0], "MoE input = ffn_norm(hc_pre(stream, attn pre)) [b, s, dim] bf16")

    @guard
    def ffn_post(m, a, out):
        rec.put(rec.file_for(M), f"{rec.lname()}/ffn_out", out, "MoE output (routed + shared) [b, s, dim] bf16")

    @guard
    def gate_post(m, a, out):
        w, idx = out
        f = rec.file_for(M)
        rec.put(f, f"{rec.lname()}/gate_weights", w, "fp32 [tokens, top_k] routing weights (normalised, x route_scale)")
        rec.put(f, f"{rec.lname()}/gate_indices", idx, "int64 [tokens, top_k] selected experts (order as torch.topk returns them)")

    @guard
    def comp_post(m, a, out):
        rec.put(rec.file_for(M), f"{rec.lname()}/compressor_latent", out,
                "compressor output [b, n_new, head_dim] bf16: pooled + compressor.norm, BEFORE RoPE and FP4 QDQ (absent when the group is incomplete)")

    @guard
    def idx_pre(m, a):
        rec.topk_log = []
        rec.in_indexer = True

    @guard
    def idx_post(m, a, out):
        ln = rec.lname()
        f = rec.file_for(M)
        logs = rec.topk_log or []
        rec.topk_log = None
        rec.in_indexer = False
        rec.put(f, f"{ln}/indexer_topk", out,
                "int32 [b, s, k] indexer output: compressed positions sorted ascending, + offset, -1 = unreachable")
        names = ["index_score"] if len(logs) == 1 else ["cand_block_scores", "index_score"]
        for nm, (inp, targs, tkw, raw) in zip(names, logs):
            kk = int(targs[0]) if targs else int(tkw.get("k"))
            if nm == "index_score":
                mean = ("bf16 [b, s, n_compressed] scores that enter the position top-k: sum_h relu(q.k)*w, -inf where unreachable"
                        " (and, for Reindex layers, outside the candidate mask)")
            else:
                mean = "bf16 [b, s, n_blocks] block scores that enter the candidate block top-k (max over 8 positions, newest block pinned to +inf)"
            rec.put(f, f"{ln}/{nm}", inp, mean, k=kk)
            rec.put(f, f"{ln}/{nm}_topk_raw", raw, "int64 raw top-k indices (tie_rule torch: CPU torch.topk, unsorted; "
                    "tie_rule lowest_index: stable sort, lower position first among equal scores)", k=kk, tie_rule=TIE_RULE)

    @guard
    def eng_pre(m, a):
        rec.put(rec.file_for(M), f"layer{m.layer_id:02d}/engram_hash_ids", a[1],
                "int64 [b, s, (max_ngram-1)*n_heads] table rows (hash % prime + offset); columns: order 2 heads 0.., order 3 .., order 4 ..")

    @guard
    def eng_post(m, a, out):
        rec.put(rec.file_for("stream"), f"layer{m.layer_id:02d}/engram_out", out,
                "stream after the Engram of this layer (applied before the block) [b, s, hc, dim] bf16")

    blocks = list(model.layers) + list(model.mtp)
    for L, blk in enumerate(blocks):
        def bpre(m, a, L=L):
            rec.layer = L

        blk.register_forward_pre_hook(bpre)
        blk.register_forward_hook(bpost)

        def mixes(x, hc_fn, hc_scale, hc_base, blk=blk, orig_mixes=blk.hc_mixes):
            pre, post, comb = orig_mixes(x, hc_fn, hc_scale, hc_base)
            record_mixes("attn" if hc_fn is blk.hc_attn_fn else "ffn", pre, post, comb)
            return pre, post, comb

        blk.hc_mixes = mixes
        blk.attn.register_forward_pre_hook(attn_pre)
        blk.attn.register_forward_hook(attn_post)
        blk.ffn.register_forward_pre_hook(ffn_pre)
        blk.ffn.register_forward_hook(ffn_post)
        blk.ffn.gate.register_forward_hook(gate_post)
        if blk.attn.compressor is not None:
            blk.attn.compressor.register_forward_hook(comp_post)
        if blk.attn.indexer is not None:
            blk.attn.indexer.register_forward_pre_hook(idx_pre)
            blk.attn.indexer.register_forward_hook(idx_post)
        if getattr(blk, "engram", None) is not None:
            blk.engram.register_forward_pre_hook(eng_pre)
            blk.engram.register_forward_hook(eng_post)

    if len(model.mtp):
        d0, dl = model.mtp[0], model.mtp[-1]

        @guard
        def main_norm_post(m, a, out):
            rec.put(rec.file_for(M), "dspark_main_x", out, "DSpark main_norm(main_proj(main_hidden)) [b, s, dim] bf16")

        @guard
        def dnorm_post(m, a, out):
            rec.put(rec.file_for(M), "dspark_norm_out", out, "DSpark head-side norm output [b, block, dim] bf16")

        @guard
        def markov_post(m, a, out):
            lb, emb = out
            i = rec.markov_calls
            rec.markov_calls += 1
            rec.put(rec.file_for(M), f"markov_{i}/logits_bias", lb, "Markov head logits bias [b, vocab] fp32 for draft slot i")
            rec.put(rec.file_for(M), f"markov_{i}/embed", emb, "Markov embedding [b, markov_rank] bf16 of the token feeding slot i")
            rec.put(rec.file_for(M), f"markov_{i}/token", a[0], "token id fed to the Markov head for slot i")

        @guard
        def conf_post(m, a, out):
            rec.put(rec.file_for(M), "confidence_logits_hook", out, "confidence head output [b, block] fp32 (logits; sigmoid gives probabilities)")

        d0.main_norm.register_forward_hook(main_norm_post)
        dl.norm.register_forward_hook(dnorm_post)
        dl.markov_head.register_forward_hook(markov_post)
        dl.confidence_head.register_forward_hook(conf_post)


def capture_state(model, args, rec, cur_len, fname):
    for L, blk in enumerate(model.layers):
        at = blk.attn
        ln = f"layer{L:02d}"
        rec.put(fname, f"{ln}/window_kv_cache", at.window_kv_cache[:1],
                "sliding-window ring [b, window, head_dim] bf16 (FP8 QDQ, RoPE'd); slot = position % window",
                tokens_seen=cur_len)
        if at.is_kv_source:
            r = at.compress_ratio
            nrow = cur_len // r
            rec.put(fname, f"{ln}/compress_kv_cache", at.compress_kv_cache[:1, :nrow],
                    "compressed KV cache rows [b, n, head_dim] bf16: RoPE at position j*ratio, then FP4 QDQ (block 16, E4M3 scale)",
                    ratio=r, rows=nrow)
            if r > 1:
                rec.put(fname, f"{ln}/compressor_kv_state", at.compressor.kv_state[:1],
                        "fp32 [b, ratio, head_dim] pending wkv rows of the incomplete group (slot = pos % ratio)")
                rec.put(fname, f"{ln}/compressor_score_state", at.compressor.score_state[:1],
                        "fp32 [b, ratio, head_dim] pending wgate scores (-inf = empty slot)")
        if at.indexer is not None and at.indexer.owns_k:
            nrow = cur_len // at.compress_ratio
            rec.put(fname, f"{ln}/index_k_cache", at.indexer.k_cache[:1, :nrow],
                    "index-key cache [b, n, index_head_dim] bf16: k_norm(wk(latent)), RoPE at j*ratio, FP4 QDQ (block 32, E8M0)",
                    rows=nrow)
    for j, blk in enumerate(model.mtp):
        rec.put(fname, f"dspark{j}/window_kv_cache", blk.attn.window_kv_cache[:1],
                "DSpark ring [b, window, head_dim] bf16 of main-model KV (kv_norm(wkv(main_x)), RoPE, FP8 QDQ)")
    if model.engram_hash is not None:
        rec.put(fname, "engram_compressed_token_cache", model.engram_hash.cache[:1, :cur_len],
                "int64 compressed token ids the Engram hash keeps per position")


# ----------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------
ST_DTYPE = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e8m0fnu: "F8_E8M0",
    torch.float4_e2m1fn_x2: "F4",
}


def read_st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
    return hdr, 8 + n


def write_st_manual(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.element_size() == 1 else t.view(-1).view(torch.uint8).numpy().tobytes()
        shape = list(t.shape)
        if t.dtype == torch.float4_e2m1fn_x2:
            shape[-1] *= 2  # safetensors F4 counts logical 4-bit elements
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def verify_st(path, tensors):
    hdr, base = read_st_header(path)
    with open(path, "rb") as f:
        data = f.read()
    conv = {}
    for name, t in tensors.items():
        info = hdr[name]
        b0, b1 = info["data_offsets"]
        if data[base + b0: base + b1] != tensor_bytes(t):
            raise RuntimeError(f"bytes differ for {name}")
        if info["dtype"] != ST_DTYPE[t.dtype]:
            raise RuntimeError(f"dtype {info['dtype']} for {name} ({t.dtype})")
        if t.dtype == torch.float4_e2m1fn_x2:
            conv[name] = "logical" if list(info["shape"]) == list(t.shape[:-1]) + [t.shape[-1] * 2] else (
                "packed" if list(info["shape"]) == list(t.shape) else "other:%s" % info["shape"])
        elif list(info["shape"]) != list(t.shape):
            raise RuntimeError(f"shape {info['shape']} for {name} ({list(t.shape)})")
    extra = set(hdr) - set(tensors) - {"__metadata__"}
    if extra:
        raise RuntimeError(f"extra tensors {sorted(extra)[:5]}")
    return hdr, sorted(set(conv.values()))


def save_weights(model, path, metadata):
    tensors = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    how = None
    try:
        from safetensors.torch import save_file

        save_file(tensors, path, metadata=metadata)
        hdr, f4 = verify_st(path, tensors)
        how = "safetensors.torch.save_file"
    except Exception as e:  # fall back to a plain writer of the documented format
        log("  safetensors library save/verify failed:", repr(e)[:400])
        write_st_manual(path, tensors, metadata)
        hdr, f4 = verify_st(path, tensors)
        how = "manual safetensors writer"
    log(f"  weights saved by {how}; F4 shape convention in header: {f4}; {len(tensors)} tensors; {os.path.getsize(path)} bytes")
    try:
        from safetensors import safe_open

        bad = 0
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                t2 = f.get_tensor(name)
                t1 = tensors[name]
                if t2.dtype != t1.dtype or tuple(t2.shape) != tuple(t1.shape) or tensor_bytes(t2) != tensor_bytes(t1):
                    bad += 1
        log(f"  safetensors.safe_open round trip: {bad} mismatching tensors")
    except Exception as e:
        log("  safetensors.safe_open round trip failed:", repr(e)[:400])
    dts = {}
    for name, info in hdr.items():
        if name != "__metadata__":
            dts[info["dtype"]] = dts.get(info["dtype"], 0) + 1
    log("  header dtype counts:", dts)
    return how, f4


def load_weights_manual(model, path):
    hdr, base = read_st_header(path)
    with open(path, "rb") as f:
        data = f.read()
    with torch.no_grad():
        for name, p in model.named_parameters():
            b0, b1 = hdr[name]["data_offsets"]
            raw = np.frombuffer(data, dtype=np.uint8, count=b1 - b0, offset=base + b0).copy()
            t = torch.from_numpy(raw).view(p.dtype).reshape(p.shape)
            if p.element_size() == 1:
                p.view(torch.uint8).copy_(t.view(torch.uint8))
            else:
                p.copy_(t)


# ----------------------------------------------------------------------------------------------
# kernels.h5
# ----------------------------------------------------------------------------------------------
def to_bf16(vals):
    return torch.from_numpy(np.asarray(vals, dtype=np.float32)).to(torch.bfloat16)


def bits_of(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def bf16_from_bits(bits):
    b = np.ascontiguousarray(np.asarray(bits, dtype=np.uint16))
    return torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16)


def f2b(x):
    """python/np float -> bf16 bit pattern (round to nearest even)"""
    return int(bits_of(to_bf16([x]))[0])


def quant_input_sets():
    sets = []
    allb = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    sets.append(("allbits_seq", allb.reshape(2048, 32),
                 "all 65536 bf16 bit patterns in increasing bit order, 32 consecutive patterns per row (rows with Inf/NaN included)"))
    perm = np.random.default_rng(20261129).permutation(65536)
    sets.append(("allbits_perm", allb[perm].reshape(2048, 32),
                 "all 65536 bf16 bit patterns in a fixed random order (numpy default_rng(20261129).permutation), 32 per row"))
    finite = allb[(allb & 0x7F80) != 0x7F80]
    nblk = -(-finite.size // 31)
    fin = np.zeros(nblk * 31, np.uint16)
    fin[: finite.size] = finite
    fin = fin.reshape(nblk, 31)
    for name, anchor in (("anchor_1p0", 0x3F80), ("anchor_448", 0x43E0), ("anchor_below_1e-4", 0x38D1)):
        a = np.full((nblk, 1), anchor, np.uint16)
        sets.append((f"allfinite_{name}", np.concatenate([a, fin], 1),
                     f"column 0 = anchor bf16 0x{anchor:04X}; columns 1..31 = every finite bf16 pattern in increasing bit order (zero padded)"))
    rng = np.random.default_rng(7)
    rows = []
    for k in range(-134, 120):
        p = 0x43E0 + (k << 7)
        for d in (-1, 0, 1):
            pb = p + d
            amax = float(bf16_from_bits([pb]).float()[0])
            fill = bits_of(to_bf16(rng.uniform(-1, 1, 31) * amax))
            sign = 0x8000 if rng.random() < 0.5 else 0
            rows.append(np.concatenate([[pb | sign], fill]).astype(np.uint16))
    sets.append(("scale_edges_448", np.stack(rows),
                 "column 0 = +-(448*2^k) and its bf16 neighbours for every k keeping it finite (the FP8 power-of-2 scale edge); "
                 "other columns uniform in (-amax, amax)"))
    sp = []

    def row(vals):
        out = []
        for v in vals:
            out.append(v if isinstance(v, int) else f2b(v))
        out = out + [0] * (32 - len(out))
        return np.array(out[:32], dtype=np.uint16)

    sp.append(row([0.0] * 32))
    sp.append(row([0x8000] * 32))
    sp.append(row([0.0, 0x8000] * 16))
    sp.append(row([0x0001] * 32))
    sp.append(row([(j + 1) | (0x8000 if j % 2 else 0) for j in range(32)]))
    sp.append(row([0x7F7F] * 32))
    sp.append(row([0x7F7F, 0xFF7F, 1.0, -1.0, 1e-30, -1e-30, 0x0001, 0x8001, 0.0, 0x8000, 3.0e38, -3.0e38]))
    sp.append(row([3.0e38, 1e-38, 1e-20, 1.0, 0x0001, 1e-10, 1e10, -2.5]))
    ties = [1.0625 + 0.125 * j for j in range(8)] + [2.0**-10, 3 * 2.0**-10, 5 * 2.0**-10, 248.0, 272.0, 304.0, 392.0]
    sp.append(row([400.0] + ties + [-t for t in ties] + [0x8000]))
    sp.append(row([0x7F80, 1.0, 2.0, -3.0]))  # +inf
    sp.append(row([0xFF80, 1.0, 2.0, -3.0]))  # -inf
    sp.append(row([0x7FC0, 1.0, 2.0, -3.0]))  # nan
    sp.append(row([1e-4, 0.5e-4, 1e-5, -1e-4]))
    sp.append(row([0.01171875, 0.005859375, 0.0029296875, 0.01]))  # 6*2^-9 floor of FP4/E4M3
    sets.append(("specials", np.stack(sp),
                 "rows: +0; -0; +-0; min subnormal; subnormals; bf16 max; max/min mixed; huge+tiny; FP8 RNE ties with scale 1 "
                 "(amax 400); +Inf; -Inf; NaN; around the 1e-4 amax floor; around the 6*2^-9 floor"))
    # FP4 ties at E2M1 midpoints, exact power-of-2 scale 2^k (amax = 6*2^k in both halves of the row)
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    rows = []
    for k in range(-12, 12):
        s = 2.0**k
        pos = [f2b(m * s) for m in grid + mids]
        pos += [f2b(m * s) + 1 for m in mids] + [f2b(m * s) - 1 for m in mids]
        vals = pos + [v | 0x8000 for v in pos]
        blocks = []
        for j in range(0, len(vals), 15):
            chunk = vals[j: j + 15]
            chunk = chunk + [0] * (15 - len(chunk))
            anchor = f2b(6 * s) | (0x8000 if (j // 15) % 2 else 0)
            blocks.append([anchor] + chunk)
        if len(blocks) % 2:
            blocks.append([f2b(6 * s)] + [0] * 15)
        for j in range(0, len(blocks), 2):
            rows.append(np.array(blocks[j] + blocks[j + 1], dtype=np.uint16))
    sets.append(("fp4_ties", np.stack(rows),
                 "each 16-wide half: element 0 = +-6*2^k (so both FP4 scale rules give exactly 2^k), then E2M1 grid points, "
                 "midpoints and the bf16 neighbours of each midpoint (times 2^k, both signs), k = -12..11"))
    e4 = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    rows = []
    amaxes = []
    for i in range(len(e4) - 1):
        amaxes += [6 * float(e4[i]), 3 * float(e4[i] + e4[i + 1])]
    amaxes += [6 * float(e4[-1]), 2688.0, 2700.0, 3000.0, 1e6, 3.0e38, 0.01171875, 0.01, 1e-5, 0.0]
    blocks = []
    for a in amaxes:
        fill = bits_of(to_bf16(rng.uniform(-1, 1, 15) * a))
        blocks.append(np.concatenate([[f2b(a)], fill]).astype(np.uint16))
    if len(blocks) % 2:
        blocks.append(np.zeros(16, np.uint16))
    for j in range(0, len(blocks), 2):
        rows.append(np.concatenate([blocks[j], blocks[j + 1]]))
    sets.append(("fp4_e4m3_scale_edges", np.stack(rows),
                 "each 16-wide half: element 0 = amax at 6 x (every E4M3 value and every midpoint between neighbours), "
                 "then values past the 448 scale saturation and below the 6*2^-9 floor; rest uniform in (-amax, amax)"))
    x = rng.standard_normal((512, 128)) * np.exp(rng.normal(0.0, 6.0, (512, 1)))
    sets.append(("random", bits_of(to_bf16(x)), "normal values times a per-row log-normal magnitude (exp(N(0,6))), 512 x 128"))
    return sets


def kernel_tests():
    items = []

    def kput(path, x, meaning, f32=True, **attrs):
        items.append(Item(path, _clone(x), meaning, attrs, f32))

    with v41.set_dtype(torch.bfloat16):
        for name, bits, desc in quant_input_sets():
            x = bf16_from_bits(bits)
            g = f"quant/{name}"
            kput(f"{g}/input", x, "bf16 input [rows, width]: " + desc)
            q, s = K.act_quant(x.clone(), 32, "ue8m0", torch.float8_e8m0fnu)
            y = K.act_quant(x.clone(), 32, "ue8m0", torch.float8_e8m0fnu, True)
            kput(f"{g}/fp8_q", q, "act_quant(x, 32, 'ue8m0') FP8 e4m3 values (the GEMM activation path)", f32=False)
            kput(f"{g}/fp8_scale", s, "act_quant scale per 32 values, E8M0 (power of two)")
            kput(f"{g}/fp8_qdq", y, "act_quant(..., inplace=True): FP8 quantize-dequantize back to bf16 (the window-KV path)")
            p, s = K.fp4_act_quant(x.clone(), 32, False, torch.float8_e8m0fnu)
            y = K.fp4_act_quant(x.clone(), 32, True)
            kput(f"{g}/fp4_e8m0_b32_q", p, "fp4_act_quant(x, 32) packed E2M1 (indexer q/k format)", f32=False)
            kput(f"{g}/fp4_e8m0_b32_scale", s, "scale per 32 values, E8M0 = 2^ceil(log2(amax/6)), amax floored at 6*2^-126")
            kput(f"{g}/fp4_e8m0_b32_qdq", y, "fp4_act_quant(x, 32, inplace=True) bf16 QDQ (index keys / index queries)")
            p, s = K.fp4_act_quant(x.clone(), 16, False, torch.float8_e4m3fn)
            y = K.fp4_act_quant(x.clone(), 16, True, scale_dtype=torch.float8_e4m3fn)
            kput(f"{g}/fp4_e4m3_b16_q", p, "fp4_act_quant(x, 16, scale e4m3) packed E2M1 (compressed-KV format)", f32=False)
            kput(f"{g}/fp4_e4m3_b16_scale", s, "scale per 16 values, E4M3 = e4m3_rne_satfinite(max(amax, 6*2^-9)/6)")
            kput(f"{g}/fp4_e4m3_b16_qdq", y, "fp4_act_quant(x, 16, inplace=True, scale_dtype=e4m3) bf16 QDQ (compressed KV cache)")
        kput("quant/FP4_TABLE", K.FP4_TABLE, "kernel_cpu FP4_TABLE: E2M1 code -> value")

        # GEMMs through model.linear
        g = torch.Generator().manual_seed(11)
        x = (torch.randn(5, 256, generator=g, dtype=torch.float32) * torch.tensor([[0.01], [1.0], [30.0], [1e-3], [3.0]], dtype=torch.float32)).to(torch.bfloat16)
        wq, ws = T.quantize_fp8_blocks(torch.randn(80, 256, generator=g, dtype=torch.float32) * 0.06)
        w = wq.clone()
        w.scale = ws
        y = v41.linear(x, w)
        aq, as_ = K.act_quant(x.clone(), 32, "ue8m0", torch.float8_e8m0fnu)
        kput("gemm/fp8/x", x, "bf16 activation [5, 256]")
        kput("gemm/fp8/x_q", aq, "its act_quant FP8 values", f32=True)
        kput("gemm/fp8/x_scale", as_, "its act_quant E8M0 scales [5, 8]")
        kput("gemm/fp8/w", wq, "FP8 e4m3 weight [80, 256]")
        kput("gemm/fp8/w_scale", ws, "E8M0 weight scale per 32x32 block [ceil(80/32)=3, 8] (last block row padded)")
        kput("gemm/fp8/y", y, "model.linear(x, w) = fp8_gemm output bf16 [5, 80]")
        codes = torch.randint(0, 256, (64, 128), generator=g, dtype=torch.int32).to(torch.uint8)
        w4 = codes.clone().view(torch.float4_e2m1fn_x2)
        w4s = torch.pow(2.0, torch.randint(-8, -4, (64, 8), generator=g, dtype=torch.int32).float()).to(torch.float8_e8m0fnu)
        w4.scale = w4s
        y4 = v41.linear(x, w4)
        kput("gemm/fp4/x", x, "bf16 activation [5, 256] (same as gemm/fp8/x)")
        kput("gemm/fp4/w", w4, "FP4 weight [64, 256] logical, stored [64, 128] float4_e2m1fn_x2")
        kput("gemm/fp4/w_scale", w4s, "E8M0 weight scale per 32 along K [64, 8]")
        kput("gemm/fp4/y", y4, "model.linear(x, w4) = fp4_gemm output bf16 [5, 64]")

        # sparse_attn
        m, h, d, nkv, width = 6, 4, 128, 200, 150
        q = (torch.randn(1, m, h, d, generator=g, dtype=torch.float32) * 3).to(torch.bfloat16)
        kv = torch.randn(1, nkv, d, generator=g, dtype=torch.float32)
        kv[0, 123] = q[0, 0, 0].float() * 2.5  # one very large logit for query 0 / head 0, picked in the second block
        kv = kv.to(torch.bfloat16)
        sink = torch.tensor([0.3, 5.0, -30.0, 0.0], dtype=torch.float32)
        idx = torch.full((1, m, width), -1, dtype=torch.int32)
        perm = torch.randperm(nkv, generator=g)
        row0 = perm[perm != 123][:width].int().clone()
        row0[70] = 123
        idx[0, 0] = row0
        r1 = torch.randperm(nkv, generator=g)[:width].int()
        r1[torch.rand(width, generator=g, dtype=torch.float32) < 0.3] = -1
        idx[0, 1] = r1
        # row 2 stays all -1
        idx[0, 3, 128:] = torch.randperm(nkv, generator=g)[: width - 128].int()
        idx[0, 4] = torch.sort(torch.randperm(nkv, generator=g)[:width].int(), descending=True).values
        idx[0, 5] = torch.randint(0, 10, (width,), generator=g, dtype=torch.int32)
        o = _ORIG_SPARSE_ATTN(q, kv, sink, idx, d**-0.5)
        kput("sparse_attn/q", q, "bf16 [1, 6, 4, 128]")
        kput("sparse_attn/kv", kv, "bf16 [1, 200, 128] (K = V); row 123 is aligned with query 0 head 0")
        kput("sparse_attn/sink", sink, "fp32 attn_sink per head")
        kput("sparse_attn/topk_idxs", idx, "int32 [1, 6, 150]: row0 random (3 blocks of 64), row1 30% -1, row2 all -1, "
             "row3 only the last partial block valid, row4 descending, row5 many duplicates")
        kput("sparse_attn/out", o, "sparse_attn(q, kv, sink, idx, 128^-0.5) bf16", softmax_scale=d**-0.5)

        # mHC Sinkhorn
        mixes = torch.randn(48, 24, generator=g, dtype=torch.float32)
        mixes[16:32] *= 8.0
        mixes[32:] *= 60.0
        hs = torch.randn(3, generator=g, dtype=torch.float32) * 0.5
        hb = torch.randn(24, generator=g, dtype=torch.float32) * 0.5
        pre, post, comb = K.hc_split_sinkhorn(mixes, hs, hb, 4, 20, 1e-6)
        kput("hc_sinkhorn/mixes", mixes, "fp32 [48, 24] mixes (rows 16..31 x8, rows 32.. x60)")
        kput("hc_sinkhorn/hc_scale", hs, "fp32 [3]")
        kput("hc_sinkhorn/hc_base", hb, "fp32 [24]")
        kput("hc_sinkhorn/pre", pre, "hc_split_sinkhorn pre [48, 4]")
        kput("hc_sinkhorn/post", post, "hc_split_sinkhorn post [48, 4]")
        kput("hc_sinkhorn/comb", comb, "hc_split_sinkhorn comb [48, 4, 4] (20 iterations, eps 1e-6)")

        # RoPE
        for nm, fargs in (
            ("tiny_compressed", (32, 512, 65536, 160000.0, 16, 32, 1)),
            ("tiny_window", (32, 512, 0, 10000.0, 16, 32, 1)),
            ("real_compressed", (64, 1024, 65536, 160000, 16, 32, 1)),
            ("real_window", (64, 1024, 0, 10000, 16, 32, 1)),
        ):
            fc = v41.precompute_freqs_cis(*fargs)
            kput(f"rope/freqs_{nm}", fc.clone(), "precompute_freqs_cis%s complex64 [positions, rd/2]" % (fargs,),
                 args=json.dumps(list(fargs)))
        fc = v41.precompute_freqs_cis(32, 512, 65536, 160000.0, 16, 32, 1)
        xr = (torch.randn(1, 8, 4, 32, generator=g, dtype=torch.float32) * 2).to(torch.bfloat16)
        y = xr.clone()
        v41.apply_rotary_emb(y, fc[100:108])
        yi = y.clone()
        v41.apply_rotary_emb(yi, fc[100:108], True)
        kput("rope/apply_x", xr, "bf16 [1, 8, 4, 32]")
        kput("rope/apply_y", y, "apply_rotary_emb(x, freqs_tiny_compressed[100:108]) (interleaved pairs, bf16 result)")
        kput("rope/apply_y_inverse", yi, "apply_rotary_emb(y, same freqs, inverse=True)")

        # RMSNorm
        nrm = v41.RMSNorm(256, 1e-20)
        with torch.no_grad():
            nrm.weight.copy_((torch.randn(256, generator=g, dtype=torch.float32) * 0.1 + 0.5).to(torch.bfloat16))
        xn = (torch.randn(4, 256, generator=g, dtype=torch.float32) * torch.tensor([[1.0], [1e-3], [0.0], [300.0]], dtype=torch.float32)).to(torch.bfloat16)
        with torch.no_grad():
            yn = nrm(xn)
        kput("rmsnorm/x", xn, "bf16 [4, 256] (row 2 all zero)")
        kput("rmsnorm/weight", nrm.weight, "bf16 [256]")
        kput("rmsnorm/y", yn, "RMSNorm(eps 1e-20) output bf16")

    # Engram layouts of the released config (numpy PCG64 multipliers, primes)
    cfg = json.load(open(os.path.join(HERE, "upstream", "config.json")))
    fields = {f.name for f in dataclasses.fields(v41.ModelArgs)}
    ra = v41.ModelArgs(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.items() if k in fields})
    layout = E.EngramLayout.from_args(ra)
    mult = E.compute_hash_multipliers(layout.layer_ids, layout.max_ngram_size, ra.engram_compressed_vocab_size)
    primes = torch.tensor(layout.primes)
    flat = [[p for per in layer for p in per] for layer in layout.primes]
    offsets = torch.tensor(np.array([np.cumsum([0, *s[:-1]]) for s in flat]))
    rows = [sum(s) for s in flat]
    log("  released-config Engram rows from primes:", rows, "config engram_num_embeddings:", list(ra.engram_num_embeddings))
    kput("engram_released/multipliers", mult, "int64 [n_engram_layers=2, max_ngram=4] hash multipliers for layers (1, 14), compressed vocab 99092")
    kput("engram_released/primes", primes, "int64 [2, 3, 8] bucket primes [layer][order-2][head]")
    kput("engram_released/offsets", offsets, "int64 [2, 24] row offsets per hash column")
    kput("engram_released/rows", np.array(rows, dtype=np.int64), "table rows = sum of primes per layer (should equal engram_num_embeddings)")
    return items


# ----------------------------------------------------------------------------------------------
# model run
# ----------------------------------------------------------------------------------------------
class ModTokenizer(T.StubTokenizer):
    """Variant edit (token_map_mod = M): token t decodes to "w{t % M}" in one of three spellings that the Engram
    normalizer collapses (case, surrounding space), so engram.build_compressed_token_map gives compressed id t % M
    and a compressed vocab of M (engram_compressed_vocab_size must be M)."""

    def decode(self, ids, skip_special_tokens=False):
        (token_id,) = ids
        return ("w%d", " W%d", "W%d ")[(token_id // TOKEN_MAP_MOD) % 3] % (token_id % TOKEN_MAP_MOD)


def make_tokenizer(vocab_size):
    return ModTokenizer(vocab_size) if TOKEN_MAP_MOD else T.StubTokenizer(vocab_size)


def build_model(args):
    with v41.set_dtype(torch.bfloat16):
        model = v41.Transformer(args, make_tokenizer(args.vocab_size))
    T.init_weights(model, SEED)
    return model.eval()


def make_tokens(V):
    g = torch.Generator().manual_seed(TOKEN_SEED)
    tokens = torch.randint(0, V, (1, PROMPT_LEN), generator=g)
    for dst, src, n, x in TOKEN_COPIES:
        tokens[0, dst:dst + n] = tokens[0, src:src + n] ^ x
    for pos, tok in TOKEN_SETS:
        tokens[0, pos] = tok
    dec_tokens = torch.randint(0, V, (N_DECODE,), generator=g)
    return tokens, dec_tokens


def plain_run(model, args):
    """Unhooked run (prefill + 8 decode steps) with the reference's own torch.topk: logits only."""
    tokens, dec_tokens = make_tokens(args.vocab_size)
    box = {}
    h = model.norm.register_forward_hook(lambda m, a, out: box.__setitem__("norm", out.detach().clone()))
    with v41.set_dtype(torch.bfloat16):
        _, logits, _ = model(tokens, 0)
        with torch.inference_mode():
            logits_all = model.head(box["norm"], full_logits=True)
        dec = [model(dec_tokens[k].view(1, 1), PROMPT_LEN + k)[1] for k in range(N_DECODE)]
    h.remove()
    return logits_all, logits, torch.cat(dec, 0)


def run_model(model, args, rec):
    tokens, dec_tokens = make_tokens(args.vocab_size)
    res = {"tokens": tokens, "dec_tokens": dec_tokens}
    with v41.set_dtype(torch.bfloat16):
        rec.stage, rec.phase = "prefill", "prefill"
        t = time.perf_counter()
        out_ids, logits, main_hidden = model(tokens, 0)
        TIMINGS["prefill_forward_s"] = time.perf_counter() - t
        F = "prefill.h5"
        rec.put(F, "tokens", tokens, "int64 [1, %d] prompt token ids (torch.Generator seed %d, then copies [dst, src, n, xor] %s "
                "(xor 1 = same Engram compressed ids) and sets [pos, token] %s (token 2/3 = pad id))"
                % (PROMPT_LEN, TOKEN_SEED, TOKEN_COPIES, TOKEN_SETS))
        rec.put(F, "logits_last", logits, "fp32 [1, vocab] logits of the last prompt position, as Transformer.forward returns them")
        rec.put(F, "output_ids", out_ids, "argmax of logits_last (temperature 0)")
        rec.put(F, "main_hidden", main_hidden, "bf16 [1, s, n_targets*dim]: mean over the 4 stream copies of the inputs of layers %s (DSpark input)"
               % (list(args.dspark_target_layer_ids),))
        with torch.inference_mode():
            logits_all = model.head(rec.last_norm, full_logits=True)
        same = bool(torch.equal(logits_all[:, -1], logits))
        log(f"  prefill: {TIMINGS['prefill_forward_s']:.2f}s; logits_all last row == logits_last: {same}; argmax {int(out_ids[0])}")
        if LOGITS_ALL_ROWS:
            rec.put(F, "logits_all", logits_all[:, -LOGITS_ALL_ROWS:], "fp32 [1, n, vocab] = model.head(final_norm_out, full_logits=True) "
                    "for the LAST n prompt positions only (variant edit)", first_position=PROMPT_LEN - LOGITS_ALL_ROWS)
        else:
            rec.put(F, "logits_all", logits_all, "fp32 [1, s, vocab] = model.head(final_norm_out, full_logits=True) for every prompt position")
        res["prefill_logits"] = logits.clone()
        res["prefill_logits_all"] = logits_all.clone()
        rec.stage, rec.phase = "prefill_dspark", "prefill/dspark"
        t = time.perf_counter()
        try:
            r = model.forward_spec(out_ids, main_hidden, 0)
            assert r is None
        except Exception:
            log("DSPARK prefill forward_spec FAILED\n" + traceback.format_exc())
        TIMINGS["prefill_dspark_s"] = time.perf_counter() - t
        rec.stage, rec.phase = "prefill", "prefill/state"
        capture_state(model, args, rec, PROMPT_LEN, "prefill.h5")
        eh = model.engram_hash
        rec.put(F, "engram/token_map", eh.token_map, "int64 [vocab] compressed id per token (stub tokenizer: id // 2; variant token_map_mod M: id % M)")
        rec.put(F, "engram/pad_id", torch.tensor([eh.pad_id]), "compressed pad id = token_map[engram_pad_id=2]")
        rec.put(F, "engram/multipliers", eh.multipliers, "int64 [n_engram_layers, max_ngram] hash multipliers (layers %s; compressed vocab %d)"
                % (list(args.engram_layer_ids), args.engram_compressed_vocab_size))
        rec.put(F, "engram/primes", eh.primes, "int64 [2, 3, 4] bucket primes [layer][order-2][head]")
        rec.put(F, "engram/offsets", eh.offsets, "int64 [2, 12] row offsets per hash column")

        decode_logits = []
        t_all = time.perf_counter()
        for k in range(N_DECODE):
            pos = PROMPT_LEN + k
            rec.stage, rec.phase = "decode", f"decode/step{k}"
            rec.kv_capture = k in (0, N_DECODE - 1)
            tok = dec_tokens[k].view(1, 1)
            out_ids, logits, main_hidden = model(tok, pos)
            D = "decode.h5"
            rec.put(D, "input_token", tok, "int64 [1, 1] token fed at this step (pre-drawn random, not the argmax)", position=pos)
            rec.put(D, "logits", logits, "fp32 [1, vocab] logits at this position", position=pos)
            rec.put(D, "output_ids", out_ids, "argmax of logits")
            rec.put(D, "main_hidden", main_hidden, "bf16 [1, 1, 3*dim] DSpark input")
            decode_logits.append(logits.clone())
            rec.phase = f"decode/step{k}/dspark"
            rec.markov_calls = 0
            rec.kv_capture = True
            try:
                out = model.forward_spec(out_ids, main_hidden, pos)
                draft_ids, draft_logits, conf = out
                rec.put(D, "draft_ids", draft_ids, "int64 [1, block+1]: [input token (= main argmax), 5 drafted tokens] (temperature 0)",
                        main_position=pos)
                rec.put(D, "draft_logits", draft_logits, "fp32 [1, block, vocab] draft logits incl. Markov bias; slot i sits at position pos+1+i")
                rec.put(D, "confidence", conf, "fp32 [1, block] confidence-head logits")
                for j, blk in enumerate(model.mtp):  # variant edit: the ring after every step, not only at the end
                    rec.put(D, f"dspark{j}/window_kv_cache", blk.attn.window_kv_cache[:1],
                            "DSpark ring [b, window, head_dim] bf16 after this step's forward_spec (slot = position % window)",
                            main_position=pos)
            except Exception:
                log(f"DSPARK forward_spec FAILED at step {k}\n" + traceback.format_exc())
            rec.phase = f"decode/step{k}/state"
            for L in args.kv_source_layers:
                c = model.layers[L].attn.compressor
                if c.compress_ratio > 1:
                    rec.put(D, f"layer{L:02d}/compressor_kv_state", c.kv_state[:1], "fp32 pending group rows after this step")
                    rec.put(D, f"layer{L:02d}/compressor_score_state", c.score_state[:1], "fp32 pending group scores after this step")
        TIMINGS["decode_total_s"] = time.perf_counter() - t_all
        rec.stage, rec.phase = "decode", "decode/final_state"
        capture_state(model, args, rec, PROMPT_LEN + N_DECODE, "decode.h5")
        log(f"  decode: {N_DECODE} steps + forward_spec in {TIMINGS['decode_total_s']:.2f}s; "
            f"argmax per step {[int(x.argmax()) for x in decode_logits]}")
    res["decode_logits"] = decode_logits
    return res


def reload_check(args, path, model1, res, rec):
    rec.enabled = False
    try:
        with v41.set_dtype(torch.bfloat16):
            m2 = v41.Transformer(args, make_tokenizer(args.vocab_size))
        load_weights_manual(m2, path)
        p1 = dict(model1.named_parameters())
        diff = [n for n, p in m2.named_parameters() if tensor_bytes(p) != tensor_bytes(p1[n])]
        log(f"  reload: {len(diff)} parameters differ from the in-memory model {diff[:5]}")
        with v41.set_dtype(torch.bfloat16):
            _, lg, _ = m2(res["tokens"], 0)
            same = bool(torch.equal(lg, res["prefill_logits"]))
            dmax = float((lg - res["prefill_logits"]).abs().max())
            lg1 = m2(res["dec_tokens"][0].view(1, 1), PROMPT_LEN)[1]
            same1 = bool(torch.equal(lg1, res["decode_logits"][0]))
        log(f"  reload: fresh model from weights.safetensors reproduces prefill logits bit-exactly: {same} (max abs diff {dmax}); "
            f"decode step 0: {same1}")
        return same and same1 and not diff
    finally:
        rec.enabled = True


class _FShim:
    """Only installed if this torch cannot F.embedding fp8/e8m0 tables on CPU: same result via raw bytes."""

    def __init__(self, base):
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def embedding(self, input, weight, *a, **k):
        if weight.element_size() == 1 and weight.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
            return weight.view(torch.uint8)[input].view(weight.dtype)
        return self._base.embedding(input, weight, *a, **k)


def probe_ops():
    notes = {}
    for dt in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        try:
            w = torch.ones(4, 2, dtype=torch.float32).to(dt)
            torch.nn.functional.embedding(torch.tensor([[1, 3]]), w).float()
            notes[str(dt)] = "F.embedding ok"
        except Exception as e:
            notes[str(dt)] = "F.embedding FAILED: %r" % (e,)
    if any("FAILED" in v for v in notes.values()):
        v41.F = _FShim(torch.nn.functional)
        notes["shim"] = "installed byte-level F.embedding shim in model.py's namespace"
    try:
        torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).clone()
        notes["fp4 clone"] = "ok"
    except Exception as e:
        notes["fp4 clone"] = "FAILED %r" % (e,)
    log("op probe:", json.dumps(notes))


def main():
    global REC
    t_start = time.perf_counter()
    import platform

    try:
        import safetensors

        stv = safetensors.__version__
    except Exception:
        stv = "missing"
    log(f"python {platform.python_version()} torch {torch.__version__} numpy {np.__version__} h5py {h5py.__version__} "
        f"safetensors {stv} threads {torch.get_num_threads()}")
    up = os.path.join(HERE, "upstream")
    for fn in sorted(os.listdir(up)):
        p = os.path.join(up, fn)
        if os.path.isfile(p):
            log(f"  upstream/{fn}: {len(open(p, encoding='utf-8').read())} chars sha256 {hashlib.sha256(open(p, 'rb').read()).hexdigest()[:16]}")
    torch.manual_seed(SEED)
    probe_ops()
    ok = {}

    t = time.perf_counter()
    try:
        if TIE_RULE != "torch":
            raise SystemExit  # kernels are written by the torch-rule run only
        items = kernel_tests()
        write_h5("kernels.h5", items, "kernel-level golden data from the vendored reference's kernel_cpu/model functions")
        ok["kernels"] = True
    except SystemExit:
        log("kernels: skipped in tie rule", TIE_RULE)
    except Exception:
        log("KERNEL TESTS FAILED\n" + traceback.format_exc())
        ok["kernels"] = False
    TIMINGS["kernels_s"] = time.perf_counter() - t
    log(f"kernels: {TIMINGS['kernels_s']:.1f}s")

    args = tiny_args()
    cfg = dataclasses.asdict(args)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    log("config:", json.dumps(cfg))

    t = time.perf_counter()
    model = build_model(args)
    TIMINGS["build_init_s"] = time.perf_counter() - t
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model built + initialised in {TIMINGS['build_init_s']:.1f}s; {n_params} parameter elements")
    wpath = os.path.join(WORK, "weights.safetensors")
    meta = {
        "format": "pt",
        "producer": "dsv41 oracle harness; vendored DeepSeek-V4.1-Flash reference; tt-metal testing.init_weights",
        "seed": str(SEED),
        "aliases": "mtp.0.embed.weight == embed.weight; mtp.0.head.weight == head.weight (shared modules, stored once)",
    }
    try:
        how, f4 = save_weights(model, wpath, meta)
        log("  weights sha256", hashlib.sha256(open(wpath, "rb").read()).hexdigest())
        shutil.copy(wpath, os.path.join(OUT, "weights.safetensors"))  # variant edit: every tie rule
        ok["weights"] = True
    except Exception:
        log("WEIGHT SAVE FAILED\n" + traceback.format_exc())
        ok["weights"] = False

    default = None
    if TIE_RULE != "torch":
        try:
            REC = None
            default = plain_run(build_model(args), args)
            log(f"  default-tie pass (unhooked model, torch.topk): prefill argmax {int(default[1].argmax())}, "
                f"decode argmax {[int(x.argmax()) for x in default[2]]}")
        except Exception:
            log("DEFAULT PASS FAILED\n" + traceback.format_exc())
    rec = Recorder(args.n_layers)
    REC = rec
    install_hooks(model, args, rec)
    res = None
    try:
        res = run_model(model, args, rec)
        ok["run"] = True
    except Exception:
        log("MODEL RUN FAILED (phase %s, layer %s)\n" % (rec.phase, rec.layer) + traceback.format_exc())
        ok["run"] = False

    if res is not None and default is not None:
        la, ll, dl = default
        d_all = (la - res["prefill_logits_all"]).abs()
        d_dec = (dl - torch.cat(res["decode_logits"], 0)).abs()
        row_max = d_all[0].amax(-1)
        log(f"  {TIE_RULE} vs torch tie rule: prefill logits max|diff| {float(d_all.max()):.4g} "
            f"(positions with any diff: {int((row_max > 0).sum())} of {PROMPT_LEN}, first at {int(torch.argmax((row_max > 0).int()))}); "
            f"argmax agreement {int((la.argmax(-1) == res['prefill_logits_all'].argmax(-1)).sum())}/{PROMPT_LEN}; "
            f"decode logits max|diff| per step {[round(float(x), 4) for x in d_dec.amax(-1)]}")
        rec.phase = "default_tie"
        if LOGITS_ALL_ROWS:
            la = la[:, -LOGITS_ALL_ROWS:]
        rec.put("prefill.h5", "logits_all", la, "fp32 [1, s, vocab] prefill logits of the same model with the reference's own torch.topk tie-breaking"
                + (" (last %d positions only)" % LOGITS_ALL_ROWS if LOGITS_ALL_ROWS else ""))
        rec.put("prefill.h5", "decode_logits", dl, "fp32 [%d, vocab] decode logits of the same model with torch.topk tie-breaking" % N_DECODE)
    if res is not None and ok.get("weights") and TIE_RULE == "torch":
        try:
            t = time.perf_counter()
            ok["reload"] = reload_check(args, wpath, model, res, rec)
            TIMINGS["reload_s"] = time.perf_counter() - t
        except Exception:
            log("RELOAD CHECK FAILED\n" + traceback.format_exc())
            ok["reload"] = False

    root = {"config_json": json.dumps(cfg), "seed": SEED, "token_seed": TOKEN_SEED, "prompt_len": PROMPT_LEN, "n_decode": N_DECODE,
            "variant_json": json.dumps(VARIANT)}
    descs = {
        "prefill.h5": "prefill (start_pos 0, %d tokens) of the tiny model: logits, sublayer outputs, mHC, top-k, candidates, caches" % PROMPT_LEN,
        "prefill_streams.h5": "prefill: embedding and the residual stream after every block and every Engram",
        "prefill_attn.h5": "prefill: attention/MoE inputs and sparse_attn q/kv/out for layers %s" % (PREFILL_IO_LAYERS,),
        "decode.h5": "%d one-token decode steps after the prefill, DSpark forward_spec at each, final caches" % N_DECODE,
    }
    root["tie_rule"] = TIE_RULE
    for fname in ("prefill.h5", "prefill_streams.h5", "prefill_attn.h5", "decode.h5"):
        items = rec.items.get(fname, [])
        if not items:
            log(f"  {fname}: nothing recorded")
            continue
        try:
            desc = descs[fname] + ("" if TIE_RULE == "torch" else
                                   "; indexer/candidate top-k ties broken by lowest position (stable sort) instead of torch.topk")
            write_h5(fname.replace(".h5", SUFFIX + ".h5"), items, desc, root)
        except Exception:
            log(f"WRITE {fname} FAILED\n" + traceback.format_exc())
    TIMINGS["total_s"] = time.perf_counter() - t_start
    log("status:", json.dumps(ok))
    log("timings:", json.dumps({k: round(v, 2) for k, v in TIMINGS.items()}))
    for fn in sorted(os.listdir(OUT)):
        log(f"  OUT/{fn}: {os.path.getsize(os.path.join(OUT, fn))} bytes")


if __name__ == "__main__":
    main()
