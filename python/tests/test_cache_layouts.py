"""dsv41.PortDumpWriter.cache: caches handed over as an engine keeps them (docs/port-dump.md "Cache
layouts"). The reference's own step stands in for the port's: its compressed_kv paged with a shuffled
block table, its index keys paged block-planar, its window block-planar in pages of 8, or its
compressed_kv as bf16 values; each dump must pass `dsv41 conform`. Block-table entries swapped fail at
the cache; a block listed twice is refused as the step is written."""
import numpy as np
import pytest

import dsv41
from conftest import CONFIG, WEIGHTS

STEPS = [("prefill", [(37 * i + 11) % 1024 for i in range(20)]), ("decode", [5])]
BS = 4  # entries per block


def page(b, table, pool, planar_vb=0):
    """Canonical entries [n, E] into a pool [pool, BS, E] at the table's blocks (planar_vb: block-planar)."""
    n, eb = b.shape
    out = np.full((pool, BS, eb), 0x55, np.uint8)
    for k, blk in enumerate(table):
        part = b[k * BS:(k + 1) * BS]
        full = np.zeros((BS, eb), np.uint8)
        full[:len(part)] = part
        if planar_vb:
            flat = np.concatenate([full[:, :planar_vb].reshape(-1), full[:, planar_vb:].reshape(-1)])
            full = flat.reshape(BS, eb)
        out[blk] = full
    return out


def block_planar(b, p, vb):
    n, eb = b.shape
    out = []
    for p0 in range(0, n, p):
        pg = b[p0:p0 + p]
        out.append(np.concatenate([pg[:, :vb].reshape(-1), pg[:, vb:].reshape(-1)]))
    return np.concatenate(out).reshape(n, eb) if n else b


def write(path, how, spoil=None):
    config = dsv41.Config.load(CONFIG)
    model = dsv41.Model(config, dsv41.Weights.load(WEIGHTS, config))
    state = model.new_state()
    w = dsv41.PortDumpWriter(path, config, weights=WEIGHTS)
    for event, tokens in STEPS:
        r = model.step(state, tokens, capture=True)
        values = dict(r["components"])
        values["model.logits"] = r["logits"][None, :]
        for c in r["caches"]:
            key = f"layer{c['layer']:02d}.cache.{c['kind']}"
            b = np.asarray(c["bytes"])
            if c["layer"] == 2 and c["kind"] in how:
                how[c["kind"]](w, c, b, spoil)
                continue
            values[key] = b
            values[key + ".positions"] = c["positions"]
        w.write_step(tokens, event, values)
    w.finish()


def paged(planar_vb):
    def hand_over(w, c, b, spoil):
        n = b.shape[0]
        blocks = (n + BS - 1) // BS
        pool = blocks + 3
        table = [int(t) for t in np.random.default_rng(n).permutation(pool)[:blocks]]   # shuffled, distinct
        data = page(b, table, pool, planar_vb)
        if spoil:
            spoil(table)
        w.cache(c["layer"], c["kind"], data, layout="paged_block_planar" if planar_vb else "paged",
                block_table=np.array(table, np.int32), entries=n, positions=c["positions"])
    return hand_over


def planar8(w, c, b, spoil):
    w.cache(c["layer"], c["kind"], block_planar(b, 8, 128), layout="block_planar:8")   # dim 128: 128 E4M3 bytes


def as_bf16(w, c, b, spoil):
    x = dsv41.formats.unpack("fp4_e2m1_e4m3_b16", b, 128)
    w.cache(c["layer"], c["kind"], dsv41.formats.pack("bf16", x), format="bf16")


def conform(path):
    return dsv41.conform(path, weights=WEIGHTS, config=CONFIG)


@pytest.mark.parametrize("name,how", [
    ("paged", {"compressed_kv": paged(0), "index_keys": paged(32)}),    # index keys dim 64: 32 nibble bytes
    ("paged.h5", {"compressed_kv": paged(0), "index_keys": paged(32)}),  # the HDF5 container reads them alike
    ("planar", {"window_kv": planar8}),
    ("bf16", {"compressed_kv": as_bf16}),
])
def test_engine_layouts_conform(tmp_path, name, how):
    path = str(tmp_path / name)
    write(path, how)
    r = conform(path)
    assert r["verdict"] == "pass" and r["exit_code"] == 0, dsv41.format_root_cause(r)


def test_swapped_block_table_fails_and_a_repeated_block_is_refused(tmp_path):
    def swap(table):
        table[0], table[1] = table[1], table[0]
    write(str(tmp_path / "swapped"), {"compressed_kv": paged(0)}, swap)
    r = conform(str(tmp_path / "swapped"))
    assert r["exit_code"] == 1
    assert r["root_cause"]["layer"] == 2 and r["root_cause"]["component"] == "cache.compressed_kv", r["root_cause"]

    def repeat(table):
        table[-1] = table[0]
    with pytest.raises(dsv41.Error, match="layer02.cache.compressed_kv.*a second time"):
        write(str(tmp_path / "repeated"), {"compressed_kv": paged(0)}, repeat)
