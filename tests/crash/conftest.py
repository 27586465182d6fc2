"""Shared by the crash suites: `start_broker`, the real `tidelog serve` subprocess of tests/integration/conftest.py.

That conftest is loaded by path under its own module name (the suites live in different directories and pytest
does not import one directory's conftest into another); its fixtures are re-exported here unchanged.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "integration" / "conftest.py"
_spec = importlib.util.spec_from_file_location("tidelog_integration_brokers", _PATH)
assert _spec is not None and _spec.loader is not None
brokers = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = brokers
_spec.loader.exec_module(brokers)

start_broker = brokers.start_broker
