"""Fixtures of the client matrix (tests/clients): one broker per module, and the client x feature record.

Each test names the row of docs/compatibility.md's client matrix it stands for with
`@pytest.mark.matrix("producer: gzip")` (a `{param}` in it is filled from the test's parameters) and its column
with the module's `CLIENT` (or `matrix(..., client=...)`). With TIDELOG_CLIENT_MATRIX=FILE in the environment, a run
writes every such test's outcome to FILE (JSON), from which tests/clients/client_matrix.py renders the table.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_matrix import FEATURES, RESULTS_ENV

from broker_process import LIVE, BrokerFactory, BrokerProcess

HERE = Path(__file__).resolve().parent
RESULTS_KEY = pytest.StashKey[list[dict[str, str]]]()
LOG_MARKS_KEY = pytest.StashKey[dict[Path, int]]()
UNSUPPORTED = re.compile(r"API key (\d+) version (\d+) is not supported")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by a test module; its tests use distinct topic and group names."""
    factory = BrokerFactory(tmp_path_factory.mktemp("broker"))
    try:
        yield factory(group_initial_rebalance_delay_ms=0)
    finally:
        factory.close_all()


# --- the client x feature record ------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clients: other-language clients against a real `tidelog serve` (tests/clients)")
    config.addinivalue_line("markers", "matrix(feature, client=None): the client matrix cell a test stands for")
    config.stash[RESULTS_KEY] = []


def matrix_cell(item: pytest.Item) -> tuple[str, str] | None:
    """(client, feature) of a marked test; an unknown feature is an error, so the table has no stray rows."""
    marker = item.get_closest_marker("matrix")
    if marker is None:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    feature = marker.args[0].format(**params)
    if feature not in FEATURES:
        raise pytest.UsageError(f"{item.nodeid}: feature {feature!r} is not a row of tests/clients/client_matrix.py")
    client = marker.kwargs.get("client") or getattr(item.module, "CLIENT", None)
    if client is None:
        raise pytest.UsageError(f"{item.nodeid}: no CLIENT in its module and no client= in its matrix marker")
    return client, feature


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.clients)
            matrix_cell(item)


@pytest.fixture(autouse=True)
def broker_log_marks(request: pytest.FixtureRequest) -> None:
    """Where each live broker's stderr ends as a test starts, so a failure can name what the broker refused."""
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
    if not item.path.is_relative_to(HERE):
        return report
    cell = matrix_cell(item)
    if cell is not None and (report.when == "call" or not report.passed):
        outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
        client, feature = cell
        reason = "" if report.passed else failure_reason(item, report)
        item.config.stash[RESULTS_KEY].append(
            {"client": client, "feature": feature, "test": item.nodeid, "outcome": outcome, "reason": reason}
        )
    if report.failed:
        for broker in LIVE:
            report.sections.append((f"tidelog broker stderr, last lines ({broker.stderr_path})", broker.stderr_tail()))
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(session.config.stash[RESULTS_KEY], indent=1) + "\n")
