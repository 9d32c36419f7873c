"""The session stacks under pytest-xdist: a stack several files share starts in one worker only,
and stops there after its last user (tests/xdist_groups.py, conftest.py's ``shared``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import os
from pathlib import Path

import pytest

from tests.conftest import *  # noqa: F403 - its hooks and fixtures, as the suite has them
from tests.conftest import shared

EVENTS = Path(__file__).parent / "events"


def note(what):
    with EVENTS.open("a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {what}\\n")


class Idle:
    def pids(self):
        return set()

    def stop(self):
        note("stop")


@pytest.fixture(scope="session")
def idle_stack(request, session_stacks):
    note("start")
    yield shared(request, Idle(), session_stacks)
"""

USER = """
from conftest import note


def test_{n}_a(idle_stack):
    note("use")


def test_{n}_b(idle_stack):
    note("use")
"""

OTHER = """
import time


def test_{n}():
    time.sleep(0.2)
"""


@pytest.mark.parametrize("dist", ["load", "loadfile"])  # (load: what -n N alone asks for)
def test_a_shared_stack_starts_once_and_stops_after_its_last_user(pytester, monkeypatch, dist):
    """xdist's own ``loadfile`` hands the files out largest first (``load``, test by test): both
    workers were given some of the stack's users and started one each."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(CONFTEST)
    for n in range(4):
        pytester.makepyfile(**{f"test_user{n}": USER.format(n=n), f"test_other{n}": OTHER.format(n=n)})
    result = pytester.runpytest_subprocess("-n", "2", "--dist", dist, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    events = (pytester.path / "events").read_text().split("\n")[:-1]
    assert [e.split()[1] for e in events] == ["start", *["use"] * 8, "stop"]
    assert len({e.split()[0] for e in events}) == 1  # one worker


# the hooks and a session stack, without the suite's conftest (torch, transformers: seconds to import)
LIGHT_CONFTEST = """
from pathlib import Path

import pytest

from tests.xdist_groups import pytest_collection_modifyitems, pytest_configure_node, pytest_xdist_make_scheduler


def note(what):
    with (Path(__file__).parent / "events").open("a") as f:
        f.write(f"- {what}\\n")


@pytest.fixture(scope="session")
def session_stacks():
    return []


@pytest.fixture(scope="session")
def idle_stack(session_stacks):
    note("start")
"""

SLOW = """
import pytest
from conftest import note


@pytest.mark.slow
def test_slow():
    note("slow")
"""

FAST = """
from conftest import note


def test_{n}_a():
    note("fast")


def test_{n}_b():
    note("fast")


def test_{n}_c():
    note("fast")
"""


def test_a_shared_stack_and_a_file_marked_slow_go_out_before_files_of_more_tests(pytester, monkeypatch):
    """By test count alone (xdist's ``loadfile``) the file of one slow test went out last: run alone
    at the end while the other workers idled."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(LIGHT_CONFTEST)
    pytester.makepyfile(test_fast0=FAST.format(n=0), test_fast1=FAST.format(n=1), test_user=USER.format(n=0))
    pytester.makepyfile(test_zslow=SLOW)
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    events = (pytester.path / "events").read_text().split("\n")[:-1]
    assert [e.split()[1] for e in events] == ["start", "use", "use", "slow", *["fast"] * 6]
