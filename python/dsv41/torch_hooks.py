"""dsv41.torch_hooks: forward hooks that record a torch model's module outputs under port dump keys.

    hooks = dsv41.torch_hooks.attach(model, names="vllm", hc=4)   # a built-in map, or your own
    print(hooks.unmapped, hooks.missing)                           # never silently dropped
    ...run a step...
    values = hooks.take()                                          # {"layer03.attn_out": array, ...}

The values go to a dump: dsv41.PortDumpWriter.write_step(..., values) in a port's own loop
(python/dsv41/port_writer.py), or dsv41.Model.step(..., port_values=hooks) inside dsv41's model.

A **name map** says which module's output is which dump component (docs/port-dump.md's table). It is
a list of entries (pattern, components[, select]) matched with re.fullmatch against the qualified
module name (after `prefix`); group 1 (or the group named `layer`) is the layer, none: a `model.`
component. `components` is a component name or a tuple of names; `select` picks the values out of
the module's output:
    None        the output itself (a tuple of components: the output tuple element by element,
                None skipping one; a dict output: its keys are components)
    int i       element i of a tuple output ((hidden, residual) engines)
    callable    f(output, hooks) -> {component: value}, or the value of the entry's one component
                (hooks.hc: the hc streams)
A user map is such a list, or a dict {pattern: component}. Built-in maps (MAPS): "official"
(inference/model.py), "vllm" (vLLM's DeepSeek V4 model, deepseek_v4.py), "vllm-v32" (vLLM's
DeepSeek V3.2, deepseek_v2.py), "sglang" (SGLang's DeepSeek V4 / V3.2 models). What each provides,
and what it cannot, is in docs/python.md "Engine name maps".

After attach: `mapped` {module name: (layer, components)}, `unmapped` (module names no entry matched;
information: an engine has many modules no component needs), `missing` (entries no module matched:
components the map expected but the model does not provide). strict=True raises a dsv41.Error
listing `missing` (and an empty mapping). After a step, `silent` lists mapped modules that did not
run in it. Outputs are converted as the dump stores them (bf16 -> float32 exact; selections int32;
masks uint8; ids int64).
"""
import re

import numpy as np

from ._arrays import to_numpy

_INT32 = {"topk", "experts", "dspark_experts", "dspark_token"}
_UINT8 = {"candidates"}
_INT64 = {"engram_ids", "accept"}


def expand_hc(output, hooks):
    """An embedding's [T, dim] copied to the hc streams, [T, hc, dim] (model.embed)."""
    a = to_numpy(output)
    if a.ndim == 2:
        if not hooks.hc:
            raise ValueError("model.embed: the module gives [T, dim]; attach(..., hc=hc_mult) copies it to the streams")
        a = np.repeat(a[:, None, :], hooks.hc, axis=1)
    return {"embed": a}


def first(output, _hooks=None):
    """Element 0 of a tuple output (vLLM's RMSNorm(x, residual) returns (normed, residual))."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _rows(a):
    return to_numpy(a).reshape(to_numpy(a).shape[0], -1)


def vllm_v4_layer(output, hooks):
    """vLLM V4 DeepseekV4DecoderLayer: CUDA path (ffn_out, residual, post_mix, res_mix) where the
    residual is the stream after the attention's hc_post (attn_stream) and post/res mixes are the
    FFN's hc post and comb (the layer's hc_post is fused into the next layer's first op); ROCm path
    (out_stream, None, None, None)."""
    if not isinstance(output, (tuple, list)) or len(output) < 2:
        return {"out_stream": output}
    if output[1] is None:
        return {"out_stream": output[0]}
    T = to_numpy(output[1]).shape[0]
    hc = to_numpy(output[1]).shape[1]
    return {"attn_stream": output[1], "hc_ffn_post": _rows(output[2]),
            "hc_ffn_comb": to_numpy(output[3]).reshape(T, hc, hc)}


def stream_output(output, _hooks=None):
    """A decoder layer's output stream: the output, or the first [T, hc, dim] element of a tuple."""
    if isinstance(output, (tuple, list)):
        for v in output:
            if v is not None and to_numpy(v).ndim == 3:
                return {"out_stream": v}
        raise ValueError("no [T, hc, dim] element in the layer's output tuple")
    return {"out_stream": output}


L = r"(?:model\.)?layers\.(\d+)"   # vLLM / SGLang: model.layers.N; a bare port: layers.N

MAPS = {
    # inference/model.py (the official code); hc_attn / hc_ffn return (pre, post, comb); the gate
    # returns (weights, indices); an indexer its top-k or a dict of index_scores, candidates, topk.
    "official": [
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
    ],
    # vLLM deepseek_v4.py: model.embed_tokens [T, dim] (the model repeats it to hc streams),
    # model.layers.N.{attn_norm, attn, attn.indexer, ffn_norm, ffn}, the layer's 4-tuple
    # (vllm_v4_layer), model.norm (every row), logits_processor / lm_head.
    "vllm": [
        (r"model\.embed_tokens", "embed", expand_hc),
        (L + r"\.attn_norm", "attn_in"),
        (L + r"\.attn", "attn_out"),
        (L + r"\.attn\.indexer", "topk"),
        (L + r"\.ffn_norm", "ffn_in"),
        (L + r"\.ffn", "ffn_out"),
        (L, ("attn_stream", "hc_ffn_post", "hc_ffn_comb"), vllm_v4_layer),
        (r"model\.norm", "final_norm_out"),
        (r"(?:logits_processor|lm_head)", "logits"),
    ],
    # vLLM deepseek_v2.py (V3.2): input_layernorm / post_attention_layernorm return (normed,
    # residual) after layer 0; the layer returns (mlp output, residual): no hc streams.
    "vllm-v32": [
        (r"model\.embed_tokens", "embed", expand_hc),
        (L + r"\.input_layernorm", "attn_in", first),
        (L + r"\.self_attn", "attn_out"),
        (L + r"\.self_attn\.indexer", "topk", first),
        (L + r"\.post_attention_layernorm", "ffn_in", first),
        (L + r"\.mlp", "ffn_out"),
        (r"model\.norm", "final_norm_out", first),
        (r"(?:logits_processor|lm_head)", "logits"),
    ],
    # SGLang deepseek_v4.py / deepseek_v2.py: the V3.2 names (the checkpoint's attn -> self_attn,
    # ffn -> mlp, attn_norm -> input_layernorm, ffn_norm -> post_attention_layernorm).
    "sglang": [
        (r"model\.embed_tokens", "embed", expand_hc),
        (L + r"\.input_layernorm", "attn_in", first),
        (L + r"\.self_attn", "attn_out", first),
        (L + r"\.self_attn\.indexer", "topk", first),
        (L + r"\.post_attention_layernorm", "ffn_in", first),
        (L + r"\.mlp", "ffn_out", first),
        (L, "out_stream", stream_output),
        (r"model\.norm", "final_norm_out", first),
        (r"(?:logits_processor|lm_head)", "logits", first),
    ],
}

NAMES = MAPS["official"]   # the official map under its earlier name


class Entry:
    """One map entry: pattern, components (tuple), select (None, int or callable)."""

    def __init__(self, pattern, components, select=None):
        self.pattern = pattern
        self.regex = re.compile(pattern)
        self.components = components if isinstance(components, tuple) else (components,)
        self.select = select

    def match(self, name):
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        if "layer" in m.groupdict():
            return int(m.group("layer"))
        return int(m.group(1)) if m.groups() and m.group(1) is not None else None

    def values(self, output, hooks):
        """{component: value} of one module output."""
        s = self.select
        if callable(s):
            got = s(output, hooks)              # {component: value}, or the value of the one component
            return got if isinstance(got, dict) else {self.components[0]: got}
        if isinstance(s, int):
            return {self.components[0]: output[s]}
        if len(self.components) > 1:
            return {c: v for c, v in zip(self.components, output) if c is not None}
        if isinstance(output, dict):
            return dict(output)
        if isinstance(output, (tuple, list)):
            raise ValueError(f"a tuple output of {len(output)} elements for '{self.components[0]}': give the entry "
                             f"a select (an element index or a function)")
        return {self.components[0]: output}


def name_map(names):
    """A list of Entry from a built-in map's name, a list of (pattern, components[, select]), or a
    dict {pattern: components}."""
    if isinstance(names, str):
        if names not in MAPS:
            raise ValueError(f"names='{names}': no such built-in map (known: {', '.join(MAPS)})")
        names = MAPS[names]
    if isinstance(names, dict):
        names = list(names.items())
    return [e if isinstance(e, Entry) else Entry(*e) for e in names]


def dump_key(layer, component):
    """"layer03.attn_out" / "model.logits" (layer None or -1)."""
    return f"model.{component}" if layer is None or layer < 0 else f"layer{layer:02d}.{component}"


def component_of(name, names="official"):
    """(layer or None, components) of a qualified module name under a map, or None when unmapped."""
    for e in name_map(names):
        if e.regex.fullmatch(name):
            comp = e.components if len(e.components) > 1 else e.components[0]
            return e.match(name), comp
    return None


def as_dump_array(component, value):
    """A module's value as the dump stores it (float32 for bf16/fp32 values, int32, uint8, int64)."""
    a = to_numpy(value)
    if component in _INT32:
        return np.ascontiguousarray(a, dtype=np.int32)
    if component in _UINT8:
        return np.ascontiguousarray(a, dtype=np.uint8)
    if component in _INT64:
        return np.ascontiguousarray(a, dtype=np.int64)
    if a.dtype != np.float32:
        raise TypeError(f"{component}: a {a.dtype} output; the dump holds float32 (bf16 values) here")
    return np.ascontiguousarray(a)


class DumpHooks:
    """Forward hooks on every submodule of `model` whose qualified name (after `prefix`) matches an
    entry of the name map. Values are kept per step until take()."""

    def __init__(self, model, names="official", prefix="", strict=False, hc=None):
        self.entries = name_map(names)
        self.hc = hc
        self.values = {}
        self.last = {}
        self.handles = []
        self.mapped = {}
        self.unmapped = []
        self.fired = set()
        self.silent = []
        used = set()
        for name, module in model.named_modules():
            if not name.startswith(prefix) or name == prefix:
                continue
            short = name[len(prefix):]
            for i, e in enumerate(self.entries):
                if e.regex.fullmatch(short):
                    layer = e.match(short)
                    self.mapped[name] = (layer, e.components)
                    used.add(i)
                    self.handles.append(module.register_forward_hook(self._hook(name, layer, e)))
                    break
            else:
                self.unmapped.append(name)
        self.missing = [f"{e.pattern} -> {', '.join(c for c in e.components if c)}"
                        for i, e in enumerate(self.entries) if i not in used]
        if strict and (self.missing or not self.mapped):
            from . import Error
            raise Error("torch_hooks.attach(strict=True): " +
                        (f"no module provides {'; '.join(self.missing)}" if self.missing else "no module matched the map") +
                        f" ({len(self.mapped)} modules mapped, {len(self.unmapped)} unmapped)")

    def _hook(self, name, layer, entry):
        def hook(_module, _inputs, output):
            self.fired.add(name)
            try:
                got = entry.values(output, self)
            except (ValueError, TypeError, IndexError) as e:
                from . import Error
                raise Error(f"torch_hooks: module '{name}' ({entry.pattern}): {e}") from None
            for comp, v in got.items():
                if v is None:
                    from . import Error
                    raise Error(f"torch_hooks: module '{name}' gave no value for '{comp}' (None)")
                self.values[dump_key(layer, comp)] = as_dump_array(comp, v)
        return hook

    def take(self):
        """The recorded {dump key: array} of the step so far, and a fresh record for the next (the
        keys taken stay in .last; .silent: the mapped modules that did not run)."""
        v, self.values = self.values, {}
        self.last = v
        self.silent = sorted(set(self.mapped) - self.fired)
        self.fired = set()
        return v

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def attach(model, names="official", prefix="", strict=False, hc=None):
    """Register the hooks on `model` (a torch.nn.Module) under a name map (a built-in map's name,
    a list of (pattern, components[, select]) or a dict); returns the DumpHooks."""
    return DumpHooks(model, names, prefix, strict, hc)
