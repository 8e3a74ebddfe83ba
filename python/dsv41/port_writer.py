"""dsv41.PortDumpWriter: a port dump written from a port's own loop (docs/python.md, "A port's own loop").

No dsv41 model underneath: the port hands over its own tensors and its own cache bytes, step by
step, and the C++ writer of `dsv41 forward --dump` (scenarios/conform/port_dump.h, PortDumpWriter)
writes them in the port dump format (docs/port-dump.md), directory or FILE.h5, atomically:

    w = dsv41.PortDumpWriter("dump", config, claim="order-variant", weights="w.safetensors")
    w.write_step(tokens, "prefill", values)        # values: {dump key: array}, e.g. hooks.take()
    w.write_step([t], "decode", values)            # starts where the last step's kept tokens ended
    w.finish()                                     # the manifest; the dump exists only now

values holds per-token components ("layer03.attn_out" [T, dim], ...; float32 holding bf16 values, or
torch bf16 / float32 tensors), "model.logits" F32 [1 or T, vocab], and caches after the step:
"layerNN.cache.<kind>" uint8 [entries, entry_bytes] (packed as the format says) with an optional
"layerNN.cache.<kind>.positions" int64 [entries]. Each cache's format and values per entry default
to the config's (window_kv / dspark_window_kv fp8_e4m3_e8m0_b32 and head_dim, compressed_kv
fp4_e2m1_e4m3_b16 and head_dim, index_keys fp4_e2m1_e8m0_b32 and index_head_dim, compressor fp32
rows and head_dim); cache_formats={key: (format, dim)} overrides them (e.g. the bf16 ablation).
Every rule of the format is checked as the step is written (a dsv41.Error naming the key): the same
keys in every step, bf16 values exact, shapes, steps that follow each other.

A cache may also be handed over as the engine keeps it (docs/port-dump.md "Cache layouts"): dsv41
reads it back into canonical entries itself, so the port's own conversion code is not trusted:

    w.cache(2, "compressed_kv", pool, layout="paged", block_table=table, entries=n)   # [blocks, bs, 288]
    w.cache(2, "index_keys", pool_k, layout="paged_block_planar", block_table=table, entries=n)
    w.cache(0, "window_kv", ring_bytes, layout="block_planar:8")
    w.cache(2, "compressed_kv", entries_656, format="fp8_ds_mla")                     # judged by values
    w.cache(2, "compressed_kv", pages, layout="paged_block_planar", format="fp8_ds_mla_model1",
            block_table=table, block_size=64, entries=n)     # FlashMLA's V4 pages [blocks, padded bytes]
    w.write_step(tokens, "prefill", values)        # the staged caches go with this step
"""
import json

from . import _core
from ._arrays import to_numpy

_DEFAULT_CACHE = {
    "window_kv": ("fp8_e4m3_e8m0_b32", "head_dim"),
    "dspark_window_kv": ("fp8_e4m3_e8m0_b32", "head_dim"),
    "compressed_kv": ("fp4_e2m1_e4m3_b16", "head_dim"),
    "index_keys": ("fp4_e2m1_e8m0_b32", "index_head_dim"),
    "compressor": ("fp32", "head_dim"),
}


class PortDumpWriter:
    """Writes a port dump from {dump key: array} per step (the lower-level path of dsv41.DumpWriter).

    path      a new or empty directory, or FILE.h5 (must not exist)
    config    a dsv41.Config (the model the port runs; its hash goes to the manifest)
    claim     "bit-exact" (default) or "order-variant" (docs/conform.md "Claims")
    accumulation  optional: "fp32" or "fp8-tensor-core" (read under order-variant)
    weights, token_map, command_line, tool   free text for the manifest
    cache_formats {cache key or kind: (format name, dim)} overriding the defaults above
    """

    def __init__(self, path, config, claim="bit-exact", *, weights="", token_map="default", command_line="",
                 tool=None, accumulation=None, cache_formats=None):
        self.path = str(path)
        self.config = config
        self._cfg = json.loads(config.json())
        self._w = _core.DumpWriter(self.path, config, weights=str(weights), token_map=str(token_map),
                                   command_line=command_line, claim=claim)
        if tool:
            _core.set_tool(self._w, tool)
        if accumulation:
            _core.set_accumulation(self._w, accumulation)
        self.cache_formats = dict(cache_formats or {})
        self.pos = None      # where the next step starts (None: at the first step's start_pos, default 0)
        self.n_steps = 0
        self._laid_out = []  # caches staged by cache() for the next write_step

    def cache(self, layer, kind, tensor, *, layout="canonical", block_table=None, block_size=None, entries=None,
              first=0, format=None, dim=None, positions=None):
        """Stages a cache as the engine keeps it for the next write_step (docs/port-dump.md "Cache layouts").

        layer, kind   the cache's layer and kind ("compressed_kv", "index_keys", "window_kv", ...)
        tensor        its uint8 bytes in the engine's shape: [entries, entry_bytes] (canonical,
                      block_planar:<P>), [num_blocks, block_size, entry_bytes] or
                      [num_blocks, block_size * entry_bytes] (paged, paged_block_planar)
        layout        "canonical", "block_planar:<P>", "paged" or "paged_block_planar"
        block_table   paged: int32 [blocks], the request's blocks in order
        block_size    paged: entries per block (default: the tensor's second dimension when 3-D)
        entries       paged: the valid entries (default: len(positions))
        first         paged: the first valid slot of the first block
        format, dim   the entry format (a CacheFormat name, "fp8_ds_mla" or "fp8_ds_mla_model1") and
                      values per entry;
                      default the kind's (see the module doc)
        positions     optional int64 [entries]: each canonical entry's position
        """
        kind = str(kind)
        if kind not in _DEFAULT_CACHE:
            raise ValueError(f"cache kind '{kind}' (known: {', '.join(_DEFAULT_CACHE)})")
        fmt, dim_key = _DEFAULT_CACHE[kind]
        meta = {"format": str(format or fmt), "dim": str(int(dim) if dim is not None else int(self._cfg[dim_key])),
                "layout": str(layout)}
        t = to_numpy(tensor)
        table = None
        if str(layout).startswith("paged"):
            if block_table is None:
                raise ValueError(f"cache layer {layer} {kind}: layout {layout} needs block_table")
            if block_size is None:
                if t.ndim != 3:
                    raise ValueError(f"cache layer {layer} {kind}: a {t.ndim}-D paged tensor needs block_size")
                block_size = t.shape[1]
            if entries is None:
                if positions is None:
                    raise ValueError(f"cache layer {layer} {kind}: layout {layout} needs entries (or positions)")
                entries = len(positions)
            meta.update(block_size=str(int(block_size)), entries=str(int(entries)), first=str(int(first)))
            table = to_numpy(block_table)
        pos = None if positions is None else to_numpy(positions)
        self._laid_out.append((int(layer), kind, t, meta, table, pos))

    def _cache_meta(self, keys):
        meta = {}
        for key in keys:
            if ".cache." not in key or key.endswith(".positions"):
                continue
            kind = key.split(".cache.", 1)[1]
            given = self.cache_formats.get(key, self.cache_formats.get(kind))
            if given is None:
                if kind not in _DEFAULT_CACHE:
                    raise ValueError(f"port value '{key}': unknown cache kind '{kind}' (known: {', '.join(_DEFAULT_CACHE)})")
                fmt, dim_key = _DEFAULT_CACHE[kind]
                given = (fmt, int(self._cfg[dim_key]))
            meta[key] = (str(given[0]), int(given[1]))
        return meta

    def write_step(self, tokens, event, values, start_pos=None, kept=None):
        """One step: its token ids, its event ("prefill", "decode", "verify", "resume+prefill", ...),
        {dump key: array}; start_pos (default: where the last step's kept tokens ended, 0 first),
        kept (default all; fewer only for "verify")."""
        tokens = [int(t) for t in to_numpy(tokens).reshape(-1)]
        if start_pos is None:
            start_pos = 0 if self.pos is None else self.pos
        vals = {str(k): to_numpy(v) for k, v in values.items()}
        laid_out, self._laid_out = self._laid_out, []
        _core.port_write_step(self._w, tokens, int(start_pos), event, vals, -1 if kept is None else int(kept),
                              self._cache_meta(vals), laid_out)
        self.pos = int(start_pos) + (len(tokens) if kept is None else int(kept))
        self.n_steps += 1

    def finish(self):
        """Writes the manifest and puts the dump in place (nothing exists at `path` before)."""
        self._w.finish()
