"""The suite's scheduling under pytest-xdist (``-n N``, whatever ``--dist`` but ``each``): each file
runs whole in one worker (its module fixtures start once), and the files that share a session stack (a session
fixture that takes ``session_stacks``: see ``shared`` in conftest.py) run together in one worker,
in collection order, so the stack starts once and stops there after its last user.

xdist's own modes are unsafe here: ``load`` spreads a file's tests (a module stack starts in each
worker), and ``loadfile`` hands files out largest first: a worker could run a stack's last user before
another user, stop the stack, then serve that user a stopped one; a second worker given some users
would start a stack of its own. (``--dist loadgroup``'s marks do nothing on pytest 9: xdist 3.8
renames a test through ``item._nodeid``, which pytest 9 no longer reads.)

The groups holding a test marked ``slow``, or sharing a session stack, go out first, then the rest
(each most tests first, as ``loadfile``): handed out by test count, a file of one 40 s test went
last and ran alone at the end while the other worker idled.

Only the workers see fixtures and marks, the controller only test ids: the workers write each file's
group, and the slow groups, to a file the controller names, whose scheduler reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

GROUPS = "stack_groups"  # the workers' input: where they write each file's group
GROUPS_DIR = pytest.StashKey[Path]()


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def session_stacks_used(item) -> set[str]:
    """The session stacks ``item`` uses (a module's own fixture of the same name hides one)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return {n for n, d in defs.items() if d[-1].scope == "session" and "session_stacks" in d[-1].argnames}


def file_groups(items) -> dict[str, str]:
    """Test file -> the group it runs in: its own, or one with every file that shares a stack with it."""
    joined: dict[str, str] = {}  # a file or a stack -> one it runs with

    def group(name: str) -> str:
        while joined.setdefault(name, name) != name:
            name = joined[name]
        return name

    for item in items:
        for stack in session_stacks_used(item):
            joined[group(f"stack:{stack}")] = group(file_of(item.nodeid))
    return {f: group(f) for f in {file_of(item.nodeid) for item in items}}


def slow_groups(items, groups: dict[str, str]) -> list[str]:
    """The groups (of ``file_groups``) that hold a test marked ``slow`` or share a session stack (the
    suite's largest groups)."""
    slow = {item for item in items if item.get_closest_marker("slow") or session_stacks_used(item)}
    return sorted({groups[file_of(item.nodeid)] for item in slow})


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    config = node.config
    if GROUPS_DIR not in config.stash:
        config.stash[GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="dayzero-xdist-"))
        config.add_cleanup(lambda: shutil.rmtree(config.stash[GROUPS_DIR], ignore_errors=True))
    node.workerinput[GROUPS] = str(config.stash[GROUPS_DIR] / "groups.json")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    path = getattr(config, "workerinput", {}).get(GROUPS)
    if path:  # every worker collects the same items: the last one's write stands
        staged = Path(f"{path}.{os.getpid()}")
        groups = file_groups(items)
        staged.write_text(json.dumps({"groups": groups, "slow": slow_groups(items, groups)}))
        staged.replace(path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadFileScheduling

    class StackGroupScheduling(LoadFileScheduling):
        written: dict | None = None  # the workers' groups.json

        def _split_scope(self, nodeid: str) -> str:
            if self.written is None:  # (asked once every worker has collected)
                self.written = json.loads((config.stash[GROUPS_DIR] / "groups.json").read_text())
            file = super()._split_scope(nodeid)
            return self.written["groups"].get(file, file)

        def _assign_work_unit(self, node) -> None:
            slow = next((group for group in self.workqueue if group in self.written["slow"]), None)
            if slow is not None:
                self.workqueue.move_to_end(slow, last=False)
            super()._assign_work_unit(node)

    return StackGroupScheduling(config, log)
