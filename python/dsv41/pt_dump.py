"""dsv41.pt_dump: torch .pt per-pass dumps (SGLang's dumper) converted into a port dump.

    python3 -m dsv41.pt_dump convert SRC_DIR DST --config golden/oracle/config.json --names sglang \
        [--hc 4] [--claim order-variant] [--rank 0] [--strict]

SGLang's dumper (python/sglang/srt/debug_utils/dumper.py) writes one file per dumped value and
forward pass, named by its tags joined with "___":
    forward_pass_id=3___rank=0___name=attn_out___dump_index=17___layer_id=5.pt      (older)
    step=3___rank=0___dump_index=17___name=attn_out___layer_id=5.pt                 (newer)
holding the tensor itself (older) or {"value": tensor, "meta": {...}} (newer). Its non-intrusive
mode names module outputs "non_intrusive__<module name>.output" (".output.<i>" for element i of a
tuple output) and always dumps the core fields "input_ids" and "positions".

What the converter does, per forward pass (ascending pass id = one step; rank --rank only):
  - step.tokens from "input_ids", the step's start from "positions"[0] (both required);
  - a value named like a dump key ("layer03.attn_out", "model.logits", "layer02.cache.window_kv",
    "...positions") is taken as is;
  - "non_intrusive__<module>.output[.i]": the module's output (its tuple rebuilt from the elements)
    through the name map (dsv41.torch_hooks: "sglang", "vllm", "official" or a user map), exactly
    as the hooks would record it;
  - any other name is matched against the map as a module name, the layer from the map's group or
    the file's layer_id tag;
  - everything else is listed as unmapped (printed; --strict makes it an error, exit 2).
The event is "prefill" for the first pass and any pass of more than one token, else "decode".
Every step must hold the same keys (docs/port-dump.md): a value dumped at some passes only is an
error of the writer naming the key.
"""
import argparse
import collections
import os
import re
import sys

from . import torch_hooks

_TAG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_DUMP_KEY = re.compile(r"^(layer\d\d|model)\.[a-z_]+(\.[a-z_]+)*$")
_NON_INTRUSIVE = re.compile(r"^non_intrusive__(.+?)\.output(?:\.(\d+))?$")


def parse_name(filename):
    """The tags of a dumper file name ({"forward_pass_id": "3", "name": ..., ...}), or None."""
    if not filename.endswith(".pt"):
        return None
    tags = {}
    for part in filename[:-3].split("___"):
        m = _TAG.match(part)
        if not m:
            return None
        tags[m.group(1)] = m.group(2)
    if "name" not in tags or ("forward_pass_id" not in tags and "step" not in tags):
        return None
    return tags


def load_value(path):
    import torch

    v = torch.load(path, map_location="cpu")
    if isinstance(v, dict) and "value" in v:
        v = v["value"]
    return v


class _Ctx:
    def __init__(self, hc):
        self.hc = hc


def scan(src, rank=0):
    """{pass id: {(name, layer_id tag or None): [(tags, path)]}} of the .pt files under src (and one
    level of subfolders), in dump_index order."""
    passes = collections.defaultdict(lambda: collections.defaultdict(list))
    dirs = [src] + [os.path.join(src, d) for d in sorted(os.listdir(src)) if os.path.isdir(os.path.join(src, d))]
    for d in dirs:
        for f in sorted(os.listdir(d)):
            tags = parse_name(f)
            if tags is None or int(tags.get("rank", "0")) != rank:
                continue
            pid = int(tags.get("forward_pass_id", tags.get("step")))
            passes[pid][(tags["name"], tags.get("layer_id"))].append((tags, os.path.join(d, f)))
    for named in passes.values():
        for files in named.values():
            files.sort(key=lambda tp: int(tp[0].get("dump_index", "0")))
    return passes


def convert_pass(named, entries, hc):
    """(tokens, start_pos, values {dump key: array}, unmapped [names]) of one pass."""
    import numpy as np

    ctx = _Ctx(hc)
    values, unmapped = {}, []
    tokens = positions = None
    modules = collections.defaultdict(dict)   # (module, layer_id tag) -> {element index or None: value}
    for (name, layer_tag), files in sorted(named.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        _, path = files[-1]                     # dumped twice in a pass: the last one
        if name == "input_ids":
            tokens = np.asarray(load_value(path).cpu().numpy(), dtype=np.int64).reshape(-1)
            continue
        if name == "positions":
            positions = np.asarray(load_value(path).cpu().numpy(), dtype=np.int64).reshape(-1)
            continue
        if _DUMP_KEY.match(name):
            values[name] = load_value(path)
            continue
        m = _NON_INTRUSIVE.match(name)
        if m:
            modules[(m.group(1), layer_tag)][None if m.group(2) is None else int(m.group(2))] = load_value(path)
            continue
        modules[(name, layer_tag)][None] = load_value(path)
    for (module, layer_tag), parts in sorted(modules.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        output = parts[None] if None in parts else tuple(parts[i] for i in sorted(parts))
        for e in entries:
            if e.regex.fullmatch(module):
                layer = e.match(module)
                if layer is None and layer_tag is not None and layer_tag != "None":
                    layer = int(layer_tag)
                for comp, v in e.values(output, ctx).items():
                    values[torch_hooks.dump_key(layer, comp)] = torch_hooks.as_dump_array(comp, v)
                break
        else:
            unmapped.append(module)
    if tokens is None or positions is None:
        raise ValueError("a pass without 'input_ids' or 'positions' (the dumper's core fields)")
    return tokens, int(positions[0]) if positions.size else 0, values, unmapped


def convert(src, dst, config, names="sglang", hc=None, claim="bit-exact", rank=0, strict=False, **writer_args):
    """Converts SRC's .pt files into the port dump DST; returns {steps, keys, unmapped}."""
    from . import Error
    from .port_writer import PortDumpWriter

    passes = scan(src, rank)
    if not passes:
        raise Error(f"pt_dump: no dumper .pt files of rank {rank} in '{src}'")
    entries = torch_hooks.name_map(names)
    w = PortDumpWriter(dst, config, claim, command_line=f"dsv41.pt_dump convert {src}", **writer_args)
    unmapped, keys = set(), None
    for k, pid in enumerate(sorted(passes)):
        try:
            tokens, start, values, um = convert_pass(passes[pid], entries, hc)
        except (ValueError, TypeError, KeyError) as e:
            raise Error(f"pt_dump: pass {pid}: {e}") from None
        unmapped.update(um)
        if strict and um:
            raise Error(f"pt_dump: pass {pid}: values no entry of the map matches: {', '.join(sorted(um))}")
        event = "prefill" if k == 0 or len(tokens) > 1 else "decode"
        w.write_step(tokens, event, values, start_pos=start)
        keys = sorted(values)
    w.finish()
    return {"steps": len(passes), "keys": keys, "unmapped": sorted(unmapped)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m dsv41.pt_dump", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="SRC_DIR of .pt files -> the port dump DST (a directory or FILE.h5)")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--config", required=True, help="a preset or config.json (the model the engine ran)")
    c.add_argument("--names", default="sglang", help="a built-in name map: " + ", ".join(torch_hooks.MAPS))
    c.add_argument("--hc", type=int, default=None, help="hc streams (default: the config's hc_mult)")
    c.add_argument("--claim", default="bit-exact", choices=["bit-exact", "order-variant"])
    c.add_argument("--rank", type=int, default=0)
    c.add_argument("--strict", action="store_true", help="an unmapped value is an error")
    a = ap.parse_args(argv)
    import json

    from . import Config, Error
    try:
        config = Config.load(a.config)
        hc = a.hc if a.hc is not None else json.loads(config.json())["hc_mult"]
        r = convert(a.src, a.dst, config, a.names, hc, a.claim, a.rank, a.strict)
    except Error as e:
        print(f"pt_dump: error: {e}", file=sys.stderr)
        return 2
    print(f"pt_dump: wrote {a.dst}: {r['steps']} steps, {len(r['keys'])} keys")
    if r["unmapped"]:
        print(f"pt_dump: unmapped (not in the dump): {', '.join(r['unmapped'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
