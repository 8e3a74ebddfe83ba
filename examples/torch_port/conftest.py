"""The example port's pytest set-up: dsv41's plugin (the dsv41_ref fixture) and --bug."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest_plugins = ["dsv41.pytest"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLE = os.path.join(ROOT, "golden", "oracle")


def pytest_addoption(parser):
    parser.addoption("--bug", default=None, help="plant a zoo bug in the port (port.BUGS)")


def pytest_configure(config):
    # The reference the fixture judges against: the tiny oracle config and weights (golden/oracle).
    if not config.getoption("--dsv41-weights"):
        config.option.dsv41_weights = os.path.join(ORACLE, "weights.safetensors")
    if config.getoption("--dsv41-config") == "tiny":
        config.option.dsv41_config = os.path.join(ORACLE, "config.json")
