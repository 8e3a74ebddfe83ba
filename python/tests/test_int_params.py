"""Issue 35, class 8: Python integer parameters are read as 64-bit integers and range-checked before
they are narrowed to the reference's 32-bit ints; a value out of range is refused with a dsv41.Error
naming the parameter and the value as given, never truncated (2**32 + 8 used to run as 8)."""
import numpy as np
import pytest

import dsv41
import dsv41.formats as F


def topk_case():
    rng = np.random.default_rng(35)
    scores = F.round_to_bf16(rng.standard_normal((3, 16)).astype(np.float32))
    reach = np.array([14, 15, 16], np.int64)
    for t in range(3):
        scores[t, reach[t]:] = -np.inf
    return {"scores": scores, "reach": reach}


def test_an_in_range_k_still_runs_and_is_not_vacuous():
    inputs = topk_case()
    ref = dsv41.ops.index_topk(**inputs, k=4)["topk"]
    assert ref.shape == (3, 4) and np.all(ref >= 0)
    r = dsv41.check("index_topk", inputs, {"topk": ref}, {"k": 4})
    assert r.passed, r.message


@pytest.mark.parametrize("k", [2**32 + 8, 10**12, -(2**31) - 1])
def test_check_refuses_a_k_past_32_bits_naming_it(k):
    inputs = topk_case()
    ref = dsv41.ops.index_topk(**inputs, k=8)["topk"]
    # 2**32 + 8 truncated to 32 bits is 8: the check passed against k=8 outputs before.
    with pytest.raises(dsv41.Error, match=r"parameter 'k'.*" + str(k) + r".* is out of range"):
        dsv41.check("index_topk", inputs, {"topk": ref}, {"k": k})


def test_ops_refuse_a_ratio_past_32_bits():
    rng = np.random.default_rng(36)
    d = 32
    kv = F.round_to_bf16(rng.standard_normal((4, d)).astype(np.float32))
    score = F.round_to_bf16(rng.standard_normal((4, d)).astype(np.float32))
    state = np.zeros((2, d), np.float32)
    ok = dsv41.ops.compress(kv=kv, score=score, kv_state=state, score_state=state, start_pos=0, ratio=2)
    assert ok["latent"].shape[0] == 2 and np.any(ok["latent"] != 0)
    # ratio=2**32+2 ran as ratio 2 before.
    with pytest.raises(dsv41.Error, match=r"parameter 'ratio' = 4294967298 is out of range"):
        dsv41.ops.compress(kv=kv, score=score, kv_state=state, score_state=state, start_pos=0, ratio=2**32 + 2)


def test_an_int_past_64_bits_is_refused_not_wrapped():
    inputs = topk_case()
    with pytest.raises(dsv41.Error, match=r"parameter 'k': " + str(2**70) + " does not fit a 64-bit integer"):
        dsv41.ops.index_topk(**inputs, k=2**70)
