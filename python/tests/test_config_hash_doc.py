"""docs/config.md "Hash" is enough to compute a config hash: the page's Python block, run as written,
gives dsv41.Config.hash (reference::config_hash) for both presets and for configs that exercise every
spelling rule (optional keys absent, a false boolean, a null enum, non-integral reals, negative
integers, empty lists); the page's key list is to_json_string's order; the hashes and the check
value the page quotes are the binary's."""
import json
import os
import re
import subprocess

import pytest

import dsv41
from conftest import NO_BINARY, ROOT, dsv41_binary

DOC = os.path.join(ROOT, "docs", "config.md")
EXE = dsv41_binary()


def hash_section():
    with open(DOC) as f:
        text = f.read()
    start = text.index("## Hash")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


@pytest.fixture(scope="module")
def doc():
    """The page's Python block executed as a module (its __main__ part not run), and the section."""
    section = hash_section()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "docs/config.md 'Hash' should hold exactly one Python block"
    ns = {"__name__": "config_hash_doc"}
    exec(compile(blocks[0], DOC, "exec"), ns)
    return ns, section


def tiny():
    return json.loads(dsv41.Config.load("tiny").json())


def test_key_list_is_to_json_string_order_and_the_text_list(doc):
    ns, section = doc
    keys = ns["KEYS"]
    assert keys == list(tiny().keys())                 # to_json_string writes declaration order
    assert len(keys) == 69 and "all 69 fields" in section
    plain = re.findall(r"```\n(max_batch_size .*?)```", section, re.S)
    assert plain and plain[0].split() == keys          # the page's plain list says the same


def test_presets_and_check_value_are_the_binarys(doc):
    ns, section = doc
    for preset in ("tiny", "full"):
        want = dsv41.Config.load(preset).hash()
        assert re.fullmatch(r"[0-9a-f]{16}", want)
        assert want in section, f"the page does not quote the {preset} preset's hash {want}"
        assert ns["config_hash"](json.loads(dsv41.Config.load(preset).json())) == want
    with open(os.path.join(ROOT, "golden", "oracle", "config.json")) as f:   # the file as written
        assert ns["config_hash"](json.load(f)) == dsv41.Config.load("tiny").hash()
    h = 0xcbf29ce484222325
    for b in b"max_batch_size=1;":
        h = ((h ^ b) * 0x100000001b3) % 2**64
    assert f"{h:016x}" in section


def variants():
    """Valid configs that exercise each spelling rule, built from the tiny preset."""
    base = tiny()
    out = []
    v = dict(base)
    for k in ("max_batch_size", "max_seq_len", "temperature", "gate_temp", "norm_topk_prob"):
        v.pop(k)                                       # optional keys absent: hashed at their defaults
    out.append(v)
    out.append(dict(base, norm_topk_prob=False, expert_dtype=None, score_func="softmax", dtype="bf16"))
    out.append(dict(base, temperature=0.7, rope_factor=2.5e-3, norm_eps=1e-6, hc_eps=3.0, gate_temp=16))
    out.append(dict(base, vision_max_wh_ratio=200, candidate_source_layer=-1))
    return out


def test_every_spelling_rule_gives_the_binarys_hash(doc):
    ns, _ = doc
    seen = set()
    for cfg in variants():
        want = dsv41.Config.from_json(json.dumps(cfg)).hash()
        assert ns["config_hash"](cfg) == want, ns["canonical_text"](cfg)
        seen.add(want)
    assert len(seen) == len(variants())                # each variant changes the hash (none vacuous)


def test_cli_prints_the_same_hash(doc, tmp_path):
    if not EXE or not os.path.exists(EXE):
        pytest.skip(NO_BINARY)
    ns, _ = doc
    cfg = variants()[2]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = subprocess.run([EXE, "bytes", "--config", str(path)], check=True, capture_output=True, text=True).stdout
    assert f"(hash {ns['config_hash'](cfg)})" in out, out
