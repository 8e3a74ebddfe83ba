"""dsv41: the DeepSeek-V4.1-Flash numerical reference and conformance checker, for Python.

    PYTHONPATH=build/python python3 -c "import dsv41"

Parts (docs/python.md):
    dsv41.formats   codecs (E2M1, E4M3, E8M0, BF16), block recipes, packed cache entries
    dsv41.ops       each reference op of the seam (reference/seam/ops.h), numpy in and out
    dsv41.Config, dsv41.Weights, dsv41.Model, dsv41.State, dsv41.DumpWriter
                    the model, its sessions (step, save, resume full / global-only) and port dumps;
                    Model(..., backend="ref") picks the ops it runs on ("cuda-exact", "cuda",
                    "ref-order:<variant>": the names of `dsv41 forward --backend`)
    dsv41.conform   `dsv41 conform DUMP` as a function: verdicts, root cause, report
    dsv41.check     one component judged in memory, with conform's tolerances and tie rules
    dsv41.pytest    the pytest plugin (fixture dsv41_ref)
    dsv41.torch_hooks  forward hooks for torch models, with name maps (official, vLLM, SGLang, yours)
    dsv41.PortDumpWriter  a port dump from a port's own loop: its tensors and cache bytes per step
    dsv41.pt_dump   torch .pt per-pass dumps (SGLang's dumper) converted into a port dump
    dsv41.data_file  a file of the built-in data (the tiny oracle model: data_file("golden/oracle/
                    weights.safetensors")), wherever dsv41 is installed (docs/install.md)

Errors are dsv41.Error (a ValueError) with the messages of the dsv41 CLI.
"""
import json as _json
import os as _os
import tempfile as _tempfile

from . import _core
from ._arrays import to_numpy_dict as _np_dict
from ._core import Config, DumpWriter, Error, Model, State, Weights, data_file, default_token_map, presets
from . import formats, ops
from .port_writer import PortDumpWriter

__version__ = _core.version

__all__ = ["Config", "Weights", "Model", "State", "DumpWriter", "Error", "CheckResult", "check", "conform",
           "data_file", "default_token_map", "presets", "formats", "ops", "PortDumpWriter"]


class CheckResult:
    """What dsv41.check returns.

    passed      True when every compared output is within its bound
    failures    one message per failing output: component, output, metric, value, bound, the first
                wrong coordinate and both values
    rows        every metric row: {output, metric, value, verdict, bound, origin}
    compared    the outputs judged; not_covered: the component's outputs the port did not give
    reference   the reference's outputs {name: numpy array}
    """

    def __init__(self, d):
        self.component = d["component"]
        self.passed = bool(d["passed"])
        self.verdict = d["verdict"]
        self.failures = list(d["failures"])
        self.rows = list(d["rows"])
        self.compared = list(d["compared"])
        self.not_covered = list(d["not_covered"])
        self.reference = dict(d["reference"])

    @property
    def message(self):
        if self.passed:
            return f"{self.component}: {', '.join(self.compared)} agree with the reference"
        return "\n".join(self.failures)

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return f"CheckResult({self.component}: {self.verdict})"


def _tolerance_text(tolerances):
    if tolerances is None:
        return ""
    if isinstance(tolerances, (str, _os.PathLike)) and _os.path.exists(tolerances):
        with open(tolerances) as f:
            return f.read()
    if isinstance(tolerances, str):
        return tolerances
    return _json.dumps(tolerances)


def check(component, inputs, outputs, params=None, *, config=None, tolerances=None):
    """Judge a port's outputs of one component, in memory (docs/python.md, "check").

    component   an op of the seam ("index_scores", "index_topk", "candidate_blocks", "compress",
                "sparse_attn", "rms_norm", ...: the conformance vectors' ops, docs/port-dump.md), or
                "indexer" (index_scores -> candidate_blocks or a given mask -> index_topk; outputs
                index_scores, candidates, topk), "compressor" (= compress), "attention" (= sparse_attn)
    inputs      {name: array}: the op's inputs as the vectors name them, the port's own inputs
                (float32 or torch bf16 for bf16 values, int32/int64/uint8 as stated)
    outputs     {name: array}: the port's outputs (any subset; the rest is "not covered")
    params      {name: scalar}: the op's parameters (k, ratio, softmax_scale, keys_format, ...)
    config      a dsv41.Config, for the ops that need one (moe_*, engram_*)
    tolerances  None (bit-exact), or conform's tolerance format as a dict, JSON text or a file:
                {"topk": {"rows_equal_frac": 0.9, "origin": "measured"}, "*": {...}}; keys
                "<component>.<output>", "<output>", "<component>" or "*"
    Returns a CheckResult (truthy when passed). The reference recomputes from `inputs`, so an
    error upstream of the component does not show here (the teacher-forced principle).
    """
    d = _core.check(component, _np_dict(inputs), _np_dict(outputs), dict(params or {}), config,
                    _tolerance_text(tolerances))
    return CheckResult(d)


def conform(dump, *, weights, config="", token_map=None, tolerances=None, order_variant=False, end_to_end=True,
            only="", stop_after_step=-1, report="", junit="", rows=True, accumulation=""):
    """`dsv41 conform DUMP --config C --weights W` (docs/conform.md) as a function.

    dump        a dump directory or FILE.h5 (docs/port-dump.md)
    weights     the weights file; config: a preset or config.json ("": the dump's own config)
    tolerances  None, a tolerance file path, or the same as a dict
    accumulation  under order-variant: "fp32" or "fp8-tensor-core" ("": the dump's manifest;
                docs/conform.md "Accumulation")
    Returns {verdict, exit_code (0 pass, 1 fail, 3 too thin), root_cause {mode, step, layer,
    component, metric, value, detail, repro} or None, comparisons [{mode, verdict, notes, rows}],
    claim, support_matrix, summary}. Bad input raises dsv41.Error (the CLI's exit 2).
    """
    tol_path = ""
    tmp = None
    if tolerances is not None:
        if isinstance(tolerances, (str, _os.PathLike)) and _os.path.exists(tolerances):
            tol_path = str(tolerances)
        else:
            tmp = _tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            tmp.write(_tolerance_text(tolerances))
            tmp.close()
            tol_path = tmp.name
    try:
        return _core.conform(str(dump), weights=str(weights), config=str(config), token_map=token_map,
                             tolerances=tol_path, order_variant=order_variant, end_to_end=end_to_end, only=only,
                             stop_after_step=stop_after_step, report=str(report), junit=str(junit), rows=rows,
                             accumulation=str(accumulation))
    finally:
        if tmp is not None:
            _os.unlink(tmp.name)


def format_root_cause(result):
    """One line per conform result, as `dsv41 conform` prints its root cause."""
    rc = result.get("root_cause")
    if rc is None:
        return f"conform: {result['verdict']} (exit {result['exit_code']})"
    where = "model" if rc["layer"] < 0 else f"layer {rc['layer']}"
    return (f"root cause ({rc['mode']}): step {rc['step']}, {where}, {rc['component']}: {rc['metric']} = "
            f"{rc['value']:g}; {rc['detail']}\n  repro: {rc['repro']}")
