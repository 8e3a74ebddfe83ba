"""dsv41.formats against the spec's constants (formats/minifloat.h, docs/formats.md) and its own inverses."""
import numpy as np
import pytest

import dsv41
import dsv41.formats as F


def test_scalar_codecs_spec_values():
    # Values stated in formats/minifloat.h and docs/formats.md, not produced by the code.
    assert F.e4m3_encode(np.array([465.0], np.float32))[0] == 0x7E            # saturates at 448
    assert F.e2m1_decode(np.array([0xD], np.uint8))[0] == -3.0
    assert F.e2m1_encode(np.array([-0.1], np.float32))[0] == 0x8              # signed zero kept
    assert F.bf16_encode(np.array([1.0], np.float32))[0] == 0x3F80
    assert F.e8m0_decode(np.array([127], np.uint8))[0] == 1.0
    assert F.e8m0_encode_ceil(np.array([1.5], np.float32))[0] == 128          # ceil to 2


def test_every_bf16_value_round_trips():
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    vals = F.bf16_decode(bits)
    finite = np.isfinite(vals)
    assert np.array_equal(F.bf16_encode(vals[finite]), bits[finite])
    assert np.array_equal(F.round_to_bf16(vals[finite]), vals[finite])


@pytest.mark.parametrize("fmt,dim", [(F.COMPRESSED_KV, 128), (F.INDEX_KEYS, 64), (F.WINDOW_KV, 128), (F.BF16, 32)])
def test_pack_unpack_is_qdq(fmt, dim):
    rng = np.random.default_rng(1)
    x = F.round_to_bf16(rng.standard_normal((7, dim)).astype(np.float32))
    b = F.pack(fmt, x)
    assert b.dtype == np.uint8 and b.shape == (7, F.entry_bytes(fmt, dim))
    back = F.unpack(fmt, b, dim)
    assert np.any(back != 0) and np.all(np.isfinite(back))
    assert np.array_equal(back, F.qdq(fmt, x))


def test_block_recipes_match_the_packed_entries():
    rng = np.random.default_rng(2)
    x = F.round_to_bf16(rng.standard_normal((3, 64)).astype(np.float32))
    codes, scales = F.quantize_blocks("index", x)
    assert codes.shape == (3, 64) and scales.shape == (3, 2)
    packed = F.pack(F.INDEX_KEYS, x)
    assert np.array_equal(packed[:, 32:], scales)                             # scales after the values
    assert np.array_equal(packed[:, :32] & 0xF, codes[:, 0::2])               # element 2k: low nibble
    assert np.array_equal(F.dequantize_blocks("index", codes, scales), F.qdq(F.INDEX_KEYS, x))


def test_bad_input_is_a_dsv41_error_with_the_cli_message():
    with pytest.raises(dsv41.Error, match="multiple of"):
        F.pack(F.COMPRESSED_KV, np.zeros((2, 10), np.float32))
    with pytest.raises(dsv41.Error, match="NaN"):
        F.pack(F.WINDOW_KV, np.full((1, 32), np.nan, np.float32))
    with pytest.raises(dsv41.Error, match="float32"):
        F.e2m1_encode(np.zeros(3, np.float64))                                # never cast silently
    assert issubclass(dsv41.Error, ValueError)
