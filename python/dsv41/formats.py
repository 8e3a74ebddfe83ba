"""dsv41.formats: the codecs of formats/ (docs/formats.md), numpy (or torch) in, numpy out.

Scalar codecs (elementwise, any shape):
    e2m1_encode(x f32) -> uint8       e2m1_decode(codes uint8) -> f32
    e4m3_encode(x f32) -> uint8       e4m3_decode(codes uint8) -> f32     (E4M3FN, satfinite)
    e8m0_encode_ceil(x f32) -> uint8  e8m0_decode(codes uint8) -> f32     (power-of-two scales)
    bf16_encode(x f32) -> uint16      bf16_decode(bits uint16) -> f32
    round_to_bf16(x f32) -> f32 (bf16 values; round to nearest even)
Block recipes ("compressed_kv": E2M1 + E4M3 per 16, "index": E2M1 + E8M0 ceil per 32,
"fp8": E4M3 + E8M0 ceil per 32, the SWA KV and activation quant):
    quantize_blocks(recipe, x f32 [..., n]) -> (codes uint8 [..., n], scales uint8 [..., n/block])
    dequantize_blocks(recipe, codes, scales) -> f32 [..., n]
Packed cache entries (formats: cache_formats(): fp4_e2m1_e4m3_b16 = compressed_kv,
fp4_e2m1_e8m0_b32 = index_keys, fp8_e4m3_e8m0_b32 = window_kv, bf16):
    entry_bytes(format, dim) -> int
    pack(format, x f32 [rows, dim]) -> uint8 [rows, entry_bytes]
    unpack(format, bytes uint8 [rows, entry_bytes], dim) -> f32 [rows, dim]
    qdq(format, x f32 [rows, dim]) -> f32 [rows, dim]  (unpack(pack(x)))
torch tensors are accepted (bf16 as float32, exact). A NaN/Inf block, a dim that is not a
multiple of the block, or bytes of the wrong size raise dsv41.Error.
"""
from . import _core
from ._arrays import to_numpy as _np

_f = _core.formats

cache_formats = _f.cache_formats
entry_bytes = _f.entry_bytes

# The names the docs use for the three packed caches.
COMPRESSED_KV = "fp4_e2m1_e4m3_b16"
INDEX_KEYS = "fp4_e2m1_e8m0_b32"
WINDOW_KV = "fp8_e4m3_e8m0_b32"
BF16 = "bf16"


def _wrap1(fn):
    def w(x):
        return fn(_np(x))
    w.__name__ = fn.__name__
    w.__doc__ = fn.__doc__
    return w


e2m1_encode = _wrap1(_f.e2m1_encode)
e4m3_encode = _wrap1(_f.e4m3_encode)
e8m0_encode_ceil = _wrap1(_f.e8m0_encode_ceil)
bf16_encode = _wrap1(_f.bf16_encode)
e2m1_decode = _wrap1(_f.e2m1_decode)
e4m3_decode = _wrap1(_f.e4m3_decode)
e8m0_decode = _wrap1(_f.e8m0_decode)
bf16_decode = _wrap1(_f.bf16_decode)
round_to_bf16 = _wrap1(_f.round_to_bf16)


def quantize_blocks(recipe, x):
    return _f.quantize_blocks(recipe, _np(x))


def dequantize_blocks(recipe, codes, scales):
    return _f.dequantize_blocks(recipe, _np(codes), _np(scales))


def pack(format, x):
    return _f.pack(format, _np(x))


def unpack(format, data, dim):
    return _f.unpack(format, _np(data), int(dim))


def qdq(format, x):
    return _f.qdq(format, _np(x))


quantize_blocks.__doc__ = _f.quantize_blocks.__doc__
dequantize_blocks.__doc__ = _f.dequantize_blocks.__doc__
pack.__doc__ = _f.pack.__doc__
unpack.__doc__ = _f.unpack.__doc__
qdq.__doc__ = _f.qdq.__doc__
