#!/usr/bin/env python3
"""Runs the example port in the reference model and writes its port dump (docs/python.md).

    PYTHONPATH=build/python python3 examples/torch_port/run_port.py --dump /tmp/port_dump \
        [--bug NAME] [--config golden/oracle/config.json] [--weights golden/oracle/weights.safetensors] [--conform]

The scenario is the self-test's (docs/selftest.md): 70 prompt tokens (37 i + 11 mod 1024) in two
prefill chunks of 45 + 25 (the odd first chunk splits a ratio-2 compressor group; the 64-slot window
wraps), then 3 decode steps (tokens 5, 723, 100). The dump claims "order-variant" (port.py).
--conform judges it with dsv41.conform and prints the root cause (exit: conform's).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dsv41  # noqa: E402
import dsv41.torch_hooks  # noqa: E402
from port import TorchPort  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLE = os.path.join(ROOT, "golden", "oracle")
PROMPT = [(37 * i + 11) % 1024 for i in range(70)]
CHUNKS = (45, 25)
DECODE = (5, 723, 100)


def run(dump, config_path=None, weights_path=None, bug=None):
    """Writes the dump; returns the dump keys the hook adapter recorded, per step."""
    config_path = config_path or os.path.join(ORACLE, "config.json")
    weights_path = weights_path or os.path.join(ORACLE, "weights.safetensors")
    config = dsv41.Config.load(config_path)
    c = json.loads(config.json())
    port = TorchPort(c["n_layers"] + c.get("n_mtp_layers", 0), bug=bug)
    hooks = dsv41.torch_hooks.attach(port)                 # the hook adapter: one line
    model = dsv41.Model(config, dsv41.Weights.load(weights_path, config), port=port.ops())
    writer = dsv41.DumpWriter(dump, config, weights=weights_path, command_line="examples/torch_port/run_port.py"
                              + (f" --bug {bug}" if bug else ""), claim="order-variant")
    state = model.new_state()
    recorded = []
    steps = [("prefill", PROMPT[:CHUNKS[0]]), ("prefill", PROMPT[CHUNKS[0]:])] + [("decode", [t]) for t in DECODE]
    for event, tokens in steps:
        hooks.take()
        # The port's modules run inside the step; their hooked outputs replace the harness's values
        # in the dump (port_values: the adapter, read after the step).
        model.step(state, tokens, dump=writer, event=event, port_values=hooks)
        recorded.append(sorted(hooks.last))
    writer.finish()
    return recorded


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="a new or empty directory (or FILE.h5)")
    ap.add_argument("--bug", default=None, help="plant a zoo bug: " + ", ".join(__import__("port").BUGS))
    ap.add_argument("--config", default=None)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--conform", action="store_true", help="judge the dump and print the root cause")
    a = ap.parse_args()
    try:
        run(a.dump, a.config, a.weights, a.bug)
    except dsv41.Error as e:
        print(f"run_port: error: {e}", file=sys.stderr)
        return 2
    print(f"run_port: wrote {a.dump}")
    if a.conform:
        r = dsv41.conform(a.dump, weights=a.weights or os.path.join(ORACLE, "weights.safetensors"),
                          config=a.config or os.path.join(ORACLE, "config.json"))
        print(dsv41.format_root_cause(r))
        return r["exit_code"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
