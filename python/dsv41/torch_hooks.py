"""dsv41.torch_hooks: forward hooks for torch models named like the official code.

A port that keeps the official module names (inference/model.py: `embed`, `layers.N.attn_norm`,
`layers.N.attn`, `layers.N.attn.indexer`, `layers.N.ffn`, ..., `norm`, `head`) gets its modules'
outputs under the port dump's keys (docs/port-dump.md) with one line:

    hooks = dsv41.torch_hooks.attach(port_model)          # registers the forward hooks
    ...run a step...
    values = hooks.take()                                 # {"layer03.attn_out": array, ...}

and hands them to the step's dump: dsv41.Model.step(state, tokens, dump=writer, port_values=hooks)
takes them after the step (hooks.take()) and writes the step with the port's values in place of the harness's
(they must have the step's shapes: a mismatch is a dsv41.Error naming the key). Outputs are converted as
the dump stores them (bf16 -> float32 exact; selections int32; masks uint8).

Module name -> dump key (NAMES below): the module's output, or, where the official module returns
several values, the one named (hc_attn / hc_ffn return (pre, post, comb); the gate returns
(weights, indices): the indices are `experts`; an indexer returns its top-k, or a dict with any of
index_scores, candidates, topk).
"""
import re

import numpy as np

from ._arrays import to_numpy

# (pattern of the qualified module name, component or tuple of components by output position)
NAMES = [
    (r"embed", "embed"),
    (r"layers\.(\d+)\.attn_norm", "attn_in"),
    (r"layers\.(\d+)\.attn", "attn_out"),
    (r"layers\.(\d+)\.attn\.indexer", "topk"),
    (r"layers\.(\d+)\.hc_attn", ("hc_attn_pre", "hc_attn_post", "hc_attn_comb")),
    (r"layers\.(\d+)\.hc_ffn", ("hc_ffn_pre", "hc_ffn_post", "hc_ffn_comb")),
    (r"layers\.(\d+)\.engram", "engram_out"),
    (r"layers\.(\d+)\.ffn_norm", "ffn_in"),
    (r"layers\.(\d+)\.ffn", "ffn_out"),
    (r"layers\.(\d+)\.ffn\.gate", (None, "experts")),
    (r"layers\.(\d+)", "out_stream"),
    (r"norm", "final_norm_out"),
    (r"head", "logits"),
]

_INT32 = {"topk", "experts"}
_UINT8 = {"candidates"}


def dump_key(layer, component):
    """"layer03.attn_out" / "model.logits" (layer None or -1)."""
    return f"model.{component}" if layer is None or layer < 0 else f"layer{layer:02d}.{component}"


def component_of(name):
    """(layer or None, component or tuple) of a qualified module name, or None when unmapped."""
    for pattern, comp in NAMES:
        m = re.fullmatch(pattern, name)
        if m:
            return (int(m.group(1)) if m.groups() else None), comp
    return None


def _as_dump_array(component, value):
    a = to_numpy(value)
    if component in _INT32:
        return np.ascontiguousarray(a, dtype=np.int32)
    if component in _UINT8:
        return np.ascontiguousarray(a, dtype=np.uint8)
    if a.dtype != np.float32:
        raise TypeError(f"{component}: a {a.dtype} output; the dump holds float32 (bf16 values) here")
    return np.ascontiguousarray(a)


class DumpHooks:
    """Forward hooks on every submodule of `model` whose qualified name (after `prefix`) maps to a
    dump component. Values are kept per step until take()."""

    def __init__(self, model, prefix=""):
        self.values = {}
        self.last = {}
        self.handles = []
        self.mapped = {}
        for name, module in model.named_modules():
            if not name.startswith(prefix):
                continue
            hit = component_of(name[len(prefix):])
            if hit is None:
                continue
            self.mapped[name] = hit
            self.handles.append(module.register_forward_hook(self._hook(*hit)))

    def _hook(self, layer, comp):
        def hook(_module, _inputs, output):
            if isinstance(comp, tuple):
                for c, v in zip(comp, output):
                    if c is not None:
                        self.values[dump_key(layer, c)] = _as_dump_array(c, v)
            elif isinstance(output, dict):
                for c, v in output.items():
                    self.values[dump_key(layer, c)] = _as_dump_array(c, v)
            else:
                self.values[dump_key(layer, comp)] = _as_dump_array(comp, output)
        return hook

    def take(self):
        """The recorded {dump key: array} of the step so far, and a fresh record for the next (the
        keys taken stay in .last)."""
        v, self.values = self.values, {}
        self.last = v
        return v

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def attach(model, prefix=""):
    """Register the hooks on `model` (a torch.nn.Module); returns the DumpHooks."""
    return DumpHooks(model, prefix)
