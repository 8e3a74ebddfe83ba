"""dsv41.ops: each reference op of the seam (reference/seam/ops.h), numpy (or torch) in, numpy out.

Every op runs the CPU reference function of the same name, exactly as the model calls it, with
the contract of the conformance vectors (docs/port-dump.md, "Conformance vectors": the same input
and parameter names). bf16 values are float32 arrays whose values are bf16 (or torch bf16, or
uint16 bf16 bits); fp32 values are float32. Weights are given as stored, a tuple
(dtype name, shape, uint8 bytes) (Weights.raw(name)); linear(x, w=weights.linear(prefix)).

    run(op, inputs, params, config=None) -> {output: array}   any op by name
    the functions below: one per op, keyword inputs and parameters, the outputs' dict
"""
from . import _core
from ._arrays import to_numpy as _np

# op -> (inputs, parameters, outputs, doc): shapes and dtypes of reference/ops/<component>.h.
_OPS = {
    "embed": (["tokens", "table"], ["hc"], ["x"], "tokens int64 [T], table bf16 [V, dim] -> x bf16 [T, hc, dim]"),
    "linear": (["x", "w"], [], ["y"], "x bf16 [T, in], w (F8_E4M3 + scale / F4 + scale / BF16) [out, in] -> y bf16 [T, out]"),
    "linear_fp32": (["x", "w"], [], ["y"], "x bf16 [T, in], w F32 [out, in] -> y fp32 [T, out] (not rounded)"),
    "grouped_linear": (["x", "w"], ["groups"], ["y"], "x bf16 [T, H*D], w BF16 -> y bf16 [T, G*o_lora]"),
    "rms_norm": (["x", "weight"], ["eps"], ["y"], "x bf16 [T, dim], weight fp32 [dim] -> y bf16 [T, dim]"),
    "rope_rows": (["x"], ["heads", "first_pos", "pos_stride", "inverse", "rope_dim", "max_seq_len", "original_seq_len",
                          "base", "factor", "beta_fast", "beta_slow"], ["x"],
                  "x bf16 [T, heads*width] -> x with RoPE on the last rope_dim channels of each head"),
    "qdq": (["x"], ["format"], ["y"], "x bf16 [n, dim] -> y bf16 [n, dim]: the cache format's quantize-dequantize"),
    "write_entries": (["storage", "entries", "rows"], ["format"], ["storage"],
                      "storage uint8 [cap, entry_bytes], entries int64 [n], rows bf16 [n, dim] -> storage"),
    "read_entries": (["storage", "entries"], ["cache_format", "cache_dim", "cache_count"], ["rows"],
                     "storage uint8 [cap, entry_bytes], entries int64 [n] -> rows bf16 [n, dim]"),
    "compress": (["kv", "score", "kv_state", "score_state"], ["start_pos", "ratio"],
                 ["latent", "first_group", "kv_state", "score_state"],
                 "kv, score fp32 [T, D], states fp32 [ratio, D] -> latent bf16 [n, D] (groups completed), "
                 "first_group int64 [1], the updated states"),
    "index_weights": (["proj"], ["index_head_dim"], ["weights"], "proj bf16 [T, Hi] -> weights bf16 [T, Hi]"),
    "index_scores": (["q", "keys", "weights", "reach"], ["keys_format", "keys_dim", "keys_count"], ["scores"],
                     "q bf16 [T, Hi, Di], keys uint8 [N, entry_bytes] (index_keys cache), weights bf16 [T, Hi], "
                     "reach int64 [T] -> scores bf16 [T, N] (-inf where n >= reach)"),
    "candidate_blocks": (["scores", "reach"], ["topk_blocks", "block_size"], ["mask"],
                         "scores bf16 [T, N], reach int64 [T] -> mask uint8 [T, N] (the newest block pinned)"),
    "mask_scores": (["scores", "mask"], [], ["scores"], "scores [T, N], mask uint8 [T, N] -> scores, -inf where mask 0"),
    "index_topk": (["scores", "reach"], ["k"], ["topk"],
                   "scores [T, N], reach int64 [T] -> topk int32 [T, min(k, N)] ascending, -1 unreachable "
                   "(ties: the lower position wins)"),
    "attention_index_rows": (["window", "topk"], ["offset", "width"], ["idxs"],
                             "window int32 [T, W], topk int32 [T, k] -> idxs int32 [T, W + k]"),
    "sparse_attn": (["q", "window_kv", "compressed", "sink", "idxs"],
                    ["softmax_scale", "compressed_format", "compressed_dim", "compressed_count"], ["o"],
                    "q bf16 [T, H, D], window_kv bf16 [W, D], compressed uint8 [N, entry_bytes], sink fp32 [H], "
                    "idxs int32 [T, K] (< W: window rows, else compressed entry idx - W; -1 none) -> o bf16 [T, H, D]"),
    "hc_mixes": (["stream", "fn", "base", "scale"], ["norm_eps", "iters", "hc_eps"], ["pre", "post", "comb"],
                 "stream bf16 [T, hc, dim] -> pre fp32 [T, hc], post fp32 [T, hc], comb fp32 [T, hc, hc]"),
    "hc_pre": (["stream", "pre"], [], ["x"], "stream bf16 [T, hc, dim], pre fp32 [T, hc] -> x bf16 [T, dim]"),
    "hc_post": (["f", "residual", "post", "comb"], [], ["stream"],
                "f bf16 [T, dim], residual bf16 [T, hc, dim], post [T, hc], comb [T, hc, hc] -> stream bf16 [T, hc, dim]"),
    "engram_hash_ids": (["history"], ["layer_id", "pad_id", "history_first", "start_pos", "count"], ["ids"],
                        "history int64 (compressed ids from history_first) -> ids int64 [count, n_cols] (config)"),
    "engram_lookup": (["table.weight", "table.scale", "ids"], ["head_dim", "n_cols"], ["kv"],
                      "table F8_E4M3 + E8M0 scale, ids int64 -> kv bf16"),
    "engram_gate_residual": (["x", "kv", "q_weight", "k_weight"], ["eps"], ["x"],
                             "x bf16 [T, hc, dim], kv bf16, q_weight, k_weight [hc, dim] -> x bf16 [T, hc, dim]"),
    "moe_gate": (["x", "gate", "gate.bias"], ["layer"], ["experts", "weights", "scores"],
                 "x bf16 [T, dim], gate BF16 [E, dim], gate.bias [E] -> experts int32 [T, k], weights fp32, scores (config)"),
}


def run(op, inputs, params=None, config=None):
    """Run reference op `op` on {name: array} inputs and {name: scalar} params -> {output: array}."""
    ins = {}
    for k, v in (inputs or {}).items():
        if isinstance(v, dict):  # a weight: {"weight": (dtype, shape, bytes), "scale": ...}
            for sub, raw in v.items():
                ins[f"{k}.{sub}"] = raw
        else:
            ins[k] = _np(v)
    return _core.run_op(op, ins, dict(params or {}), config)


def _make(op, inputs, params, outputs, doc):
    def fn(*, config=None, **kw):
        unknown = set(kw) - set(inputs) - set(params) - {n.replace(".", "_") for n in inputs}
        if unknown:
            raise _core.Error(f"dsv41.ops.{op}: unknown argument(s) {sorted(unknown)} (inputs {inputs}, "
                              f"parameters {params})")
        ins = {n: kw[n.replace(".", "_")] if n.replace(".", "_") in kw else kw[n] for n in inputs
               if n in kw or n.replace(".", "_") in kw}
        ps = {n: kw[n] for n in params if n in kw}
        return run(op, ins, ps, config)
    fn.__name__ = op
    fn.__doc__ = (f"{doc}.\n\nInputs: {', '.join(inputs)}; parameters: {', '.join(params) or 'none'}; returns "
                  f"{{{', '.join(outputs)}}} (reference/seam/ops.h Ops::{op}).")
    return fn


for _op, (_in, _par, _out, _doc) in _OPS.items():
    globals()[_op] = _make(_op, _in, _par, _out, _doc)

__all__ = ["run"] + list(_OPS)


def linear_weight(weights, prefix):
    """{"weight": ..., "scale": ...} of a checkpoint linear (as stored) for linear(x=..., w=...)."""
    w = {"weight": weights.raw(prefix + ".weight")}
    if prefix + ".scale" in set(weights.names()):
        w["scale"] = weights.raw(prefix + ".scale")
    return w
