"""dsv41.Model(..., backend=NAME): the ops the model runs on, by the names of `dsv41 forward --backend`
(docs/python.md). The default is the reference; an order-variant backend runs its own sums (the CLI's
bits), its dump records the backend and its claim and passes conform under it; sessions resume bit for
bit on it; bad names are a dsv41.Error naming the valid ones; the CUDA names need a CUDA build and a
device (a clear error otherwise)."""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest

import dsv41
from conftest import CONFIG, NO_BINARY, WEIGHTS, dsv41_binary

EXE = dsv41_binary()
PROMPT = [(13 * i + 7) % 1024 for i in range(40)]
DECODE = [5, 723]
VARIANT = "ref-order:splitk"


@pytest.fixture(scope="module")
def cw():
    c = dsv41.Config.load(CONFIG)
    return c, dsv41.Weights.load(WEIGHTS, c)


def logits_of(model, dump=None):
    s = model.new_state()
    rows = [model.step(s, PROMPT, dump=dump)["logits"]]
    rows += [model.step(s, [t], dump=dump)["logits"] for t in DECODE]
    for r in rows:
        assert np.all(np.isfinite(r)) and np.any(r != 0)
    return np.stack(rows)


def test_ref_is_the_default(cw):
    c, w = cw
    default, ref = dsv41.Model(c, w), dsv41.Model(c, w, backend="ref")
    assert (default.backend, default.claim) == ("ref", "bit-exact")
    assert np.array_equal(logits_of(default).view(np.uint32), logits_of(ref).view(np.uint32))


def test_order_variant_runs_its_own_sums_and_gives_the_cli_bits(cw, tmp_path):
    c, w = cw
    variant = dsv41.Model(c, w, backend=VARIANT)
    assert (variant.backend, variant.claim) == (VARIANT, "order-variant")
    got, ref = logits_of(variant), logits_of(dsv41.Model(c, w))
    assert not np.array_equal(got.view(np.uint32), ref.view(np.uint32)), "another summation order: some bits differ"
    if not EXE or not os.path.exists(EXE):
        pytest.skip(NO_BINARY)
    out = tmp_path / "out.h5"
    subprocess.run([EXE, "forward", "-q", "--config", CONFIG, "--weights", WEIGHTS, "--backend", VARIANT,
                    "--prompt", ",".join(map(str, PROMPT)), "--decode", ",".join(map(str, DECODE)), "-o", str(out)],
                   check=True, capture_output=True)
    with h5py.File(out, "r") as f:
        assert f.attrs["backend"] == VARIANT
        assert np.array_equal(f["logits"][...].view(np.uint32), got.view(np.uint32))


def test_dump_records_the_backend_and_conforms_under_its_claim(cw, tmp_path):
    c, w = cw
    dump = tmp_path / "dump"
    writer = dsv41.DumpWriter(str(dump), c, weights=WEIGHTS)  # claim: the model's
    logits_of(dsv41.Model(c, w, backend=VARIANT), dump=writer)
    assert (writer.claim, writer.backend) == ("order-variant", VARIANT)
    writer.finish()
    m = json.loads((dump / "dump.json").read_text())
    assert (m["claim"], m["backend"]) == ("order-variant", VARIANT)
    r = dsv41.conform(str(dump), weights=WEIGHTS, config=CONFIG)
    assert r["exit_code"] == 0 and r["claim"] == "order-variant", dsv41.format_root_cause(r)
    # A bit-exact claim for an order-variant backend's values is refused.
    strict = dsv41.DumpWriter(str(tmp_path / "strict"), c, weights=WEIGHTS, claim="bit-exact")
    variant = dsv41.Model(c, w, backend=VARIANT)
    with pytest.raises(dsv41.Error, match="claims only 'order-variant'"):
        variant.step(variant.new_state(), PROMPT, dump=strict)


def test_sessions_resume_bit_for_bit_on_the_backend(cw, tmp_path):
    c, w = cw
    model = dsv41.Model(c, w, backend=VARIANT)
    s = model.new_state()
    model.step(s, PROMPT)
    path = str(tmp_path / "s.dsv41s")
    model.save_session(s, path)
    plain = model.step(s, [DECODE[0]])["logits"]
    resumed, info = model.load_session(path, "full")
    assert info["pos"] == len(PROMPT)
    again = model.step(resumed, [DECODE[0]])["logits"]
    assert np.any(plain != 0) and np.array_equal(plain.view(np.uint32), again.view(np.uint32))


def test_bad_names_name_the_valid_ones(cw):
    c, w = cw
    for name, part in [("nope", "unknown backend"), ("ref-order:sideways", "unknown reordered variant"),
                       ("ref-bf16kv", "not the official formats"),
                       (VARIANT + ":attn_out:L2:S0", "planted defect")]:
        with pytest.raises(dsv41.Error) as e:
            dsv41.Model(c, w, backend=name)
        assert isinstance(e.value, ValueError)
        assert part in str(e.value), str(e.value)
        assert str(e.value).endswith("; valid: ref, ref-order:<variant>, cuda-exact, cuda"), str(e.value)
    with pytest.raises(dsv41.Error, match="port and backend"):
        dsv41.Model(c, w, port={"index_topk": lambda layer, **a: None}, backend=VARIANT)
    with pytest.raises(TypeError):
        dsv41.Model(c, w, backend=3)


def test_token_ids_are_range_checked_not_truncated(cw):
    c, w = cw
    model = dsv41.Model(c, w, backend=VARIANT)
    with pytest.raises(dsv41.Error, match="vocab"):
        model.step(model.new_state(), [2**32 + 5])  # 5 after a 32-bit truncation: a valid id
    with pytest.raises(TypeError):
        model.step(model.new_state(), [2**64])


@pytest.mark.parametrize("name", ["cuda-exact", "cuda"])
def test_cuda_names_need_a_cuda_build_and_a_device(cw, name):
    c, w = cw
    try:
        model = dsv41.Model(c, w, backend=name)
    except dsv41.Error as e:
        assert f"backend {name}:" in str(e) and ("no CUDA device" in str(e) or "no CUDA path" in str(e)), str(e)
        return
    assert model.claim == ("order-variant" if name == "cuda" else "bit-exact")
    got = logits_of(model)
    if name == "cuda-exact":
        assert np.array_equal(got.view(np.uint32), logits_of(dsv41.Model(c, w)).view(np.uint32))
