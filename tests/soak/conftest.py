"""The soak suites start their broker through `start_broker` from tests/integration/conftest.py.

That conftest is loaded by path under its own module name (pytest does not import one directory's conftest into
another); if another suite loaded it already, that module is reused.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "tidelog_integration_brokers"
if _NAME not in sys.modules:
    _PATH = Path(__file__).resolve().parents[1] / "integration" / "conftest.py"
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert _spec is not None and _spec.loader is not None
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])
brokers = sys.modules[_NAME]

start_broker = brokers.start_broker
