"""The module gives the CLI's bits on the oracle run: dsv41.Model and dsv41.ops against what the
`dsv41` binary writes (`dsv41 forward -o OUT.h5 --dump DIR`, read with h5py and the port-dump
reader), bit for bit. Also sessions (save, resume full / global-only) and the CLI's error messages."""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest

import dsv41
import dsv41.formats as F
from conftest import CONFIG, NO_BINARY, WEIGHTS, dsv41_binary

EXE = dsv41_binary()
PROMPT = [(13 * i + 7) % 1024 for i in range(50)]
DECODE = [5, 723]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    if not EXE or not os.path.exists(EXE):
        pytest.skip(NO_BINARY)
    d = tmp_path_factory.mktemp("cli")
    out, dump = d / "out.h5", d / "dump"
    subprocess.run([EXE, "forward", "--config", CONFIG, "--weights", WEIGHTS, "--prompt", ",".join(map(str, PROMPT)),
                    "--decode", ",".join(map(str, DECODE)), "-o", str(out), "--dump", str(dump)], check=True,
                   capture_output=True)
    return out, dump


@pytest.fixture(scope="module")
def model():
    c = dsv41.Config.load(CONFIG)
    return dsv41.Model(c, dsv41.Weights.load(WEIGHTS, c))


def run_steps(model, capture=False):
    s = model.new_state()
    recs = [model.step(s, PROMPT, capture=capture)]
    recs += [model.step(s, [t], capture=capture) for t in DECODE]
    return s, recs


def test_model_logits_and_selections_are_the_cli_bits(cli_run, model):
    out, _ = cli_run
    _, recs = run_steps(model)
    with h5py.File(out, "r") as f:
        logits = f["logits"][...]
        assert logits.shape[0] == 3
        for k, r in enumerate(recs):
            assert np.all(np.isfinite(r["logits"])) and np.any(r["logits"] != 0)
            assert np.array_equal(r["logits"].view(np.uint32), logits[k].view(np.uint32)), f"step {k}"
        for layer in recs[0]["topk"]:
            cli = f[f"topk/layer{layer:02d}"][...]         # [N, W]: each step's rows, -1 padded to W
            at = 0
            for k, r in enumerate(recs):
                t = r["topk"][layer]
                assert np.any(t >= 0)
                assert np.array_equal(cli[at:at + t.shape[0], :t.shape[1]], t), f"topk layer {layer} step {k}"
                assert np.all(cli[at:at + t.shape[0], t.shape[1]:] == -1)
                at += t.shape[0]
            assert at == cli.shape[0]
        for layer in recs[0]["experts"]:
            rows = np.concatenate([r["experts"][layer] for r in recs])
            assert np.array_equal(rows, f[f"experts/layer{layer:02d}"][...]), f"experts layer {layer}"


def test_ops_give_the_cli_bits_on_its_dumped_inputs(cli_run, model):
    """Each op recomputed by dsv41.ops from the CLI dump's inputs equals the CLI dump's output."""
    from safetensors_reader import read_step  # a small reader of the dump's step files (no dependency)
    _, dump = cli_run
    step = read_step(os.path.join(dump, "step_000000.safetensors"))
    c = json.loads(dsv41.Config.load(CONFIG).json())
    T = len(PROMPT)
    # hc_pre + rms_norm: layer 3's attn_in from its in_stream and in_pre (the pre its attention applies)
    x = dsv41.ops.hc_pre(stream=step["layer03.in_stream"], pre=step["layer03.in_pre"])["x"]
    w = model_weight(c, "layers.3.attn_norm.weight")
    y = dsv41.ops.rms_norm(x=x, weight=w, eps=c["norm_eps"])["y"]
    assert np.any(y != 0)
    assert np.array_equal(y.view(np.uint32), step["layer03.attn_in"].view(np.uint32))
    # index_topk from the dumped index scores: the dumped top-k (layer 2: ratio 2, N = T // 2)
    scores = step["layer02.index_scores"]
    reach = np.array([(p + 1) // 2 for p in range(T)], np.int64)
    topk = dsv41.ops.index_topk(scores=scores, reach=reach, k=c["index_topk"])["topk"]
    assert np.array_equal(topk, step["layer02.topk"])
    # the caches: unpacking and repacking the dumped bytes gives the same bytes
    kv = step["layer02.cache.compressed_kv"]
    assert np.array_equal(F.pack(F.COMPRESSED_KV, F.unpack(F.COMPRESSED_KV, kv, c["head_dim"])), kv)


_WEIGHTS = {}


def model_weight(c, name):
    if "w" not in _WEIGHTS:
        cfg = dsv41.Config.load(CONFIG)
        _WEIGHTS["w"] = dsv41.Weights.load(WEIGHTS, cfg)
    return _WEIGHTS["w"].tensor(name)


def test_capture_equals_the_cli_dump(cli_run, model):
    from safetensors_reader import read_step
    _, dump = cli_run
    _, recs = run_steps(model, capture=True)
    for k, r in enumerate(recs):
        step = read_step(os.path.join(dump, f"step_{k:06d}.safetensors"))
        for key, v in r["components"].items():
            assert key in step, key
            assert np.array_equal(np.ascontiguousarray(v).view(np.uint8), np.ascontiguousarray(step[key]).view(np.uint8)), \
                f"step {k} {key}"


def test_sessions_full_resume_is_bit_exact_and_global_only_runs(model, tmp_path):
    s = model.new_state()
    model.step(s, PROMPT)
    path = str(tmp_path / "s.dsv41")
    model.save_session(s, path)
    plain = model.step(s.copy(), [DECODE[0]])["logits"]
    resumed, info = model.load_session(path, "full")
    assert info["pos"] == len(PROMPT) and info["has_swa"]
    again = model.step(resumed, [DECODE[0]])["logits"]
    assert np.any(plain != 0) and np.array_equal(plain.view(np.uint32), again.view(np.uint32))
    g, ginfo = model.load_session(path, "global-only")
    assert ginfo["replayed_tokens"] == min(len(PROMPT), 64)
    assert np.all(np.isfinite(model.step(g, [DECODE[0]])["logits"]))
    with pytest.raises(dsv41.Error, match="resume mode"):
        model.load_session(path, "half")


def test_errors_carry_the_cli_message(tmp_path):
    if not EXE or not os.path.exists(EXE):
        pytest.skip(NO_BINARY)
    bad = tmp_path / "bad.json"
    bad.write_text('{"dim": }')
    p = subprocess.run([EXE, "bytes", "--config", str(bad)], capture_output=True, text=True)
    assert p.returncode == 2
    with pytest.raises(dsv41.Error) as e:
        dsv41.Config.load(str(bad))
    assert f"dsv41: error: {e.value}" in p.stderr
