"""The client x feature record of docs/compatibility.md's client matrix, for every test directory.

A test names the matrix cell it stands for with `@pytest.mark.matrix("producer: gzip", client=...)`: a `{param}`
in either is filled from the test's parameters, the client is one of tests/client_matrix.py's CLIENTS or CLIENT_IDS
(without `client=`, the module's `CLIENT`), and a test may carry several marks (or get them per parameter through
`pytest.param(..., marks=...)`). With TIDELOG_CLIENT_MATRIX=FILE in the environment, a run writes every marked
test's outcome to FILE (JSON), from which tests/client_matrix.py renders the table; a failure's reason names the
requests the brokers refused during the test (from their logs).

Any failed test also gets the last lines of every live broker's stderr (the brokers fixtures of tests/integration,
tests/security, tests/clients and tests/soak started and have not stopped yet) in its report.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_process import LIVE
from client_matrix import CLIENT_IDS, CLIENTS, FEATURES, RESULTS_ENV

RESULTS_KEY = pytest.StashKey[list[dict[str, str]]]()
LOG_MARKS_KEY = pytest.StashKey[dict[Path, int]]()
UNSUPPORTED = re.compile(r"API key (\d+) version (\d+) is not supported")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "matrix(feature, client=None): a client matrix cell (tests/client_matrix.py)")
    config.stash[RESULTS_KEY] = []


def matrix_cells(item: pytest.Item) -> list[tuple[str, str]]:
    """(client, feature) of each matrix mark of a test; an unknown feature or client is an error, so the table has
    no stray rows or columns."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    cells: dict[tuple[str, str], None] = {}
    for marker in item.iter_markers("matrix"):
        feature = marker.args[0].format(**params)
        if feature not in FEATURES:
            raise pytest.UsageError(f"{item.nodeid}: feature {feature!r} is not a row of tests/client_matrix.py")
        named = marker.kwargs.get("client") or getattr(item.module, "CLIENT", None)
        if named is None:
            raise pytest.UsageError(f"{item.nodeid}: no CLIENT in its module and no client= in its matrix marker")
        client = named.format(**params)
        client = CLIENT_IDS.get(client, client)
        if client not in CLIENTS:
            raise pytest.UsageError(f"{item.nodeid}: client {client!r} is not a column of tests/client_matrix.py")
        cells[client, feature] = None
    return list(cells)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        matrix_cells(item)  # a bad mark fails the collection


@pytest.fixture(autouse=True)
def broker_log_marks(request: pytest.FixtureRequest) -> None:
    """Where each live broker's stderr ends as a marked test starts, so a failure can name what the broker refused."""
    if request.node.get_closest_marker("matrix") is not None:
        request.node.stash[LOG_MARKS_KEY] = {broker.stderr_path: len(broker.stderr_text()) for broker in LIVE}


def failure_reason(item: pytest.Item, report: pytest.TestReport) -> str:
    """The first line of the failure, and the requests the broker refused during the test (from its log)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    reason = crash.message.splitlines()[0][:160] if crash is not None else report.outcome
    refused: dict[str, None] = {}
    for path, mark in item.stash.get(LOG_MARKS_KEY, {}).items():
        text = Path(path).read_text(errors="replace")[mark:]
        refused.update(dict.fromkeys(f"API key {k} v{v}" for k, v in UNSUPPORTED.findall(text)))
    return reason + (f" (the broker refused: {', '.join(refused)})" if refused else "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed:  # what the brokers the test ran against said last (broker_process.py's LIVE)
        for broker in LIVE:
            report.sections.append((f"tidelog broker stderr, last lines ({broker.stderr_path})", broker.stderr_tail()))
    if report.when == "call" or not report.passed:
        outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
        reason = "" if report.passed else failure_reason(item, report)
        for client, feature in matrix_cells(item):
            item.config.stash[RESULTS_KEY].append(
                {"client": client, "feature": feature, "test": item.nodeid, "outcome": outcome, "reason": reason}
            )
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(session.config.stash[RESULTS_KEY], indent=1) + "\n")
