"""dsv41.pytest: the pytest plugin of dsv41 (docs/python.md, "pytest").

Enable it in a port's conftest.py:

    pytest_plugins = ["dsv41.pytest"]

and write tests against the reference:

    def test_indexer(dsv41_ref):
        dsv41_ref.check("indexer", inputs, my_outputs, params)

A failing check raises AssertionError whose message names the component, the output, the metric
with its value and bound, the first wrong coordinate and both values (dsv41.check). The fixture
also judges a whole dump: dsv41_ref.conform(dump) fails with conform's root cause and repro line.

Options (or environment): --dsv41-config (DSV41_CONFIG, default "tiny"), --dsv41-weights
(DSV41_WEIGHTS: a weights file; needed by model and conform), --dsv41-tolerances
(DSV41_TOLERANCES: a tolerance file applied to every check).
"""
import os

import pytest

import dsv41


def pytest_addoption(parser):
    g = parser.getgroup("dsv41")
    g.addoption("--dsv41-config", default=os.environ.get("DSV41_CONFIG", "tiny"),
                help="config preset or config.json of the reference (default tiny)")
    g.addoption("--dsv41-weights", default=os.environ.get("DSV41_WEIGHTS", ""),
                help="the weights file the reference model and conform use")
    g.addoption("--dsv41-tolerances", default=os.environ.get("DSV41_TOLERANCES", ""),
                help="tolerance file (docs/conform.md format) applied to every check and conform")


class Reference:
    """The object the dsv41_ref fixture gives a test."""

    def __init__(self, config_name, weights_path, tolerances):
        self.config_name = config_name
        self.weights_path = weights_path
        self.tolerances = tolerances or None
        self._config = None
        self._weights = None

    @property
    def config(self):
        if self._config is None:
            self._config = dsv41.Config.load(self.config_name)
        return self._config

    @property
    def weights(self):
        if self._weights is None:
            if not self.weights_path:
                pytest.fail("dsv41_ref.weights: no weights file (--dsv41-weights or DSV41_WEIGHTS)")
            self._weights = dsv41.Weights.load(self.weights_path, self.config)
        return self._weights

    def model(self, port=None, backend="ref"):
        """A dsv41.Model on the reference weights (port: {op: callable}; backend: the ops it runs on, docs/python.md)."""
        return dsv41.Model(self.config, self.weights, port=port, backend=backend)

    def check(self, component, inputs, outputs, params=None, tolerances=None, config=None):
        """dsv41.check; raises AssertionError with the located failure message. Returns the CheckResult."""
        __tracebackhide__ = True
        r = dsv41.check(component, inputs, outputs, params, config=config or self.config,
                        tolerances=tolerances if tolerances is not None else self.tolerances)
        if not r.passed:
            raise AssertionError("dsv41 check failed:\n" + r.message)
        return r

    def conform(self, dump, **kw):
        """dsv41.conform on the fixture's config and weights; raises AssertionError with the root cause
        unless the verdict is pass. Returns the result dict."""
        __tracebackhide__ = True
        kw.setdefault("tolerances", self.tolerances)
        r = dsv41.conform(dump, weights=self.weights_path or self.weights.source, config=self.config_name, **kw)
        if r["exit_code"] != 0:
            notes = [n for c in r["comparisons"] for n in c["notes"] if n.startswith("FAIL")][:5]
            raise AssertionError(f"dsv41 conform: {r['verdict']} (exit {r['exit_code']})\n"
                                 + dsv41.format_root_cause(r) + ("\n" + "\n".join(notes) if notes else ""))
        return r


@pytest.fixture(scope="session")
def dsv41_ref(pytestconfig):
    """The dsv41 reference: .check(component, inputs, outputs, params), .conform(dump), .model(), .config."""
    return Reference(pytestconfig.getoption("--dsv41-config"), pytestconfig.getoption("--dsv41-weights"),
                     pytestconfig.getoption("--dsv41-tolerances"))
