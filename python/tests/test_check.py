"""dsv41.check and the pytest fixture: the reference's own outputs pass, a planted error fails with
a message that names the component, the output, the metric, the first wrong coordinate and both
values; another tie rule is named as such; tolerances follow conform's format."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dsv41


def subprocess_env():
    """The environment of a child pytest: this dsv41 package first on PYTHONPATH (absolute)."""
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(dsv41.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
import dsv41.formats as F


def topk_case():
    rng = np.random.default_rng(3)
    scores = F.round_to_bf16(rng.standard_normal((4, 20)).astype(np.float32))
    scores[:, 5] = scores[:, 6] = 9.0                       # an exact tie
    reach = np.array([17, 18, 19, 20], np.int64)
    for t in range(4):
        scores[t, reach[t]:] = -np.inf
    return {"scores": scores, "reach": reach}, {"k": 6}


def test_reference_outputs_pass_and_are_not_vacuous():
    inputs, p = topk_case()
    ref = dsv41.ops.index_topk(**inputs, **p)["topk"]
    assert ref.dtype == np.int32 and np.any(ref >= 0)
    r = dsv41.check("index_topk", inputs, {"topk": ref}, p)
    assert r.passed and r.compared == ["topk"], r.message
    assert any(row["metric"] == "rows_equal_frac" and row["value"] == 1.0 for row in r.rows)


def test_a_wrong_float_names_coordinate_values_and_metric():
    rng = np.random.default_rng(4)
    x = F.round_to_bf16(rng.standard_normal((3, 64)).astype(np.float32))
    w = rng.standard_normal(64).astype(np.float32)
    y = dsv41.ops.rms_norm(x=x, weight=w, eps=1e-6)["y"]
    bad = y.copy()
    bad[2, 17] = F.round_to_bf16(np.array([bad[2, 17] * 2 + 1], np.float32))[0]
    r = dsv41.check("rms_norm", {"x": x, "weight": w}, {"y": bad}, {"eps": 1e-6})
    assert not r.passed
    msg = r.message
    assert "rms_norm: output 'y': bit_equal_frac" in msg and "first mismatch at [2, 17]" in msg, msg
    assert "ref=" in msg and "port=" in msg, msg


def test_another_tie_rule_is_named():
    scores = np.full((1, 20), -1.0, np.float32)
    scores[0, [1, 3, 5, 7, 9]] = [5, 4, 3, 2, 1.5]           # five clear winners
    scores[0, [8, 12]] = 1.0                                # the 6th place is tied: position 8 wins
    inputs, p = {"scores": scores, "reach": np.array([20], np.int64)}, {"k": 6}
    ref = dsv41.ops.index_topk(**inputs, **p)["topk"]
    assert 8 in ref[0] and 12 not in ref[0]
    other = np.sort(np.where(ref == 8, 12, ref), axis=1).astype(np.int32)  # the higher position wins
    r = dsv41.check("index_topk", inputs, {"topk": other}, p)
    assert not r.passed, r.message
    assert "first differing row 0" in r.message and "[0, 8] only in ref" in r.message, r.message
    assert "inside the tie band" in r.message, r.message


def test_tolerances_in_conform_format():
    inputs, p = topk_case()
    ref = dsv41.ops.index_topk(**inputs, **p)["topk"]
    with pytest.raises(dsv41.Error, match="origin"):
        dsv41.check("index_topk", inputs, {"topk": ref}, p, tolerances={"topk": {"rows_equal_frac": 0.5}})
    with pytest.raises(dsv41.Error, match="unknown metric"):
        dsv41.check("index_topk", inputs, {"topk": ref}, p, tolerances={"*": {"bogus": 1, "origin": "stated"}})
    with pytest.raises(dsv41.Error, match="not an output"):
        dsv41.check("index_topk", inputs, {"nope": ref}, p)


def test_fixture_failure_message(tmp_path):
    """A port's test through the plugin: pytest fails and prints the located message."""
    t = tmp_path / "test_port_like.py"
    t.write_text(textwrap.dedent('''
        import numpy as np, dsv41.formats as F
        pytest_plugins = ["dsv41.pytest"]
        def test_norm(dsv41_ref):
            x = F.round_to_bf16(np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32))
            w = np.ones(32, np.float32)
            y = x.copy()  # a "port" that forgot to normalise
            dsv41_ref.check("rms_norm", {"x": x, "weight": w}, {"y": y}, {"eps": 1e-6})
    '''))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(t)],
                       capture_output=True, text=True, cwd=tmp_path, env=subprocess_env())
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "dsv41 check failed" in out and "rms_norm: output 'y'" in out and "first mismatch at [" in out, out
