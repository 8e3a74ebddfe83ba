"""dsv41.PortDumpWriter: a port dump from a port's own loop ({dump key: array} per step, its cache
bytes), no dsv41 model under the writer (docs/python.md "A port's own loop"). The values here are
the reference's own (dsv41.Model.step(capture=True) stands in for the port's step), so the dump must
pass `dsv41 conform` bit-exact in both containers, and match what DumpWriter writes of the same
steps; a wrong value, a wrong cache byte, a changing key set and a bad key are caught."""
import json
import os

import h5py
import numpy as np
import pytest

import dsv41
from conftest import CONFIG, WEIGHTS

STEPS = [("prefill", [(37 * i + 11) % 1024 for i in range(45)]), ("prefill", [3, 14, 15, 92, 65]),
         ("decode", [5]), ("decode", [723])]


def step_values(r):
    """A step's {dump key: array}: every captured component, the logits, every cache with positions."""
    values = dict(r["components"])
    values["model.logits"] = r["logits"][None, :]
    for c in r["caches"]:
        key = f"layer{c['layer']:02d}.cache.{c['kind']}"
        values[key] = c["bytes"]
        values[key + ".positions"] = c["positions"]
    return values


def write(path, mutate=None):
    config = dsv41.Config.load(CONFIG)
    model = dsv41.Model(config, dsv41.Weights.load(WEIGHTS, config))
    state = model.new_state()
    w = dsv41.PortDumpWriter(path, config, weights=WEIGHTS, tool="test_port_writer")
    for k, (event, tokens) in enumerate(STEPS):
        values = step_values(model.step(state, tokens, capture=True))
        assert np.any(values["layer03.attn_out"] != 0) and np.all(np.isfinite(values["model.logits"]))
        if mutate:
            mutate(k, values)
        w.write_step(tokens, event, values)
    w.finish()
    return w


def conform(path):
    return dsv41.conform(path, weights=WEIGHTS, config=CONFIG)


@pytest.mark.parametrize("suffix", ["", ".h5"])
def test_own_loop_dump_conforms(tmp_path, suffix):
    path = str(tmp_path / ("dump" + suffix))
    w = write(path)
    assert w.n_steps == len(STEPS) and w.pos == sum(len(t) for _, t in STEPS)
    r = conform(path)
    assert r["verdict"] == "pass" and r["exit_code"] == 0, dsv41.format_root_cause(r)
    if suffix:
        with h5py.File(path) as f:
            m = json.loads(f.attrs["manifest"])
    else:
        with open(os.path.join(path, "dump.json")) as f:
            m = json.load(f)
    assert m["claim"] == "bit-exact" and m["tool"] == "test_port_writer" and m["n_steps"] == len(STEPS)
    assert "cache.window_kv" in m["components"] and "attn_out" in m["components"]


def test_wrong_values_are_located(tmp_path):
    def bump_attn(k, values):
        if k == 1:
            values["layer05.attn_out"] = values["layer05.attn_out"] * np.float32(2)   # still bf16 values
    write(str(tmp_path / "a"), bump_attn)
    r = conform(str(tmp_path / "a"))
    assert r["exit_code"] == 1
    assert r["root_cause"]["step"] == 1 and r["root_cause"]["layer"] == 5 and r["root_cause"]["component"] == "attn_out"

    def flip_cache(k, values):
        if k == 2:
            b = values["layer02.cache.compressed_kv"].copy()
            b[0, 0] ^= 0x11
            values["layer02.cache.compressed_kv"] = b
    write(str(tmp_path / "c"), flip_cache)
    r = conform(str(tmp_path / "c"))
    assert r["exit_code"] == 1
    assert r["root_cause"]["step"] == 2 and r["root_cause"]["layer"] == 2
    assert r["root_cause"]["component"].startswith("cache.compressed_kv"), r["root_cause"]


def test_writer_refuses_bad_steps(tmp_path):
    config = dsv41.Config.load(CONFIG)
    dim = json.loads(config.json())["dim"]
    w = dsv41.PortDumpWriter(str(tmp_path / "d"), config)
    w.write_step([1, 2], "prefill", {"layer00.attn_in": np.zeros((2, dim), np.float32)})
    with pytest.raises(dsv41.Error, match="holds other components"):
        w.write_step([3], "decode", {"layer00.ffn_in": np.zeros((1, dim), np.float32)})
    with pytest.raises(dsv41.Error, match="component table"):
        w.write_step([3], "decode", {"layer00.nonesuch": np.zeros((1, dim), np.float32)})
    with pytest.raises(dsv41.Error, match="not a dump key"):
        w.write_step([3], "decode", {"attn_in": np.zeros((1, dim), np.float32)})
    with pytest.raises(dsv41.Error, match="bf16|BF16"):
        w.write_step([3], "decode", {"layer00.attn_in": np.full((1, dim), 1.0 + 2.0 ** -12, np.float32)})
    with pytest.raises(dsv41.Error, match="starts at position"):
        w.write_step([3], "decode", {"layer00.attn_in": np.zeros((1, dim), np.float32)}, start_pos=7)
    with pytest.raises(ValueError, match="unknown cache kind"):
        w.write_step([3], "decode", {"layer00.cache.nonesuch": np.zeros((1, 4), np.uint8)})
    assert not os.path.exists(tmp_path / "d" / "dump.json")   # no manifest: no dump
