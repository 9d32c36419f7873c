"""What ``--help`` says a default is, the command does (run as a user runs it)."""

from __future__ import annotations

import json
import os
import re

import pytest
from pydantic import Field

from dayzero.settings import Settings
from dayzero.settings_help import _bounds, settings_help

from .conftest import run_dayzero


@pytest.mark.parametrize("command", ["generate", "up"])
def test_checkpoint_help_names_the_variable_that_is_its_default(command, tmp_path):
    """``--checkpoint``'s help said its default was the built-in model, while DAYZERO_CHECKPOINT (which
    ``generate --help`` names nowhere) is read first: a variable left set served another checkpoint."""
    helped = run_dayzero(command, "--help")
    option = helped.stdout.split("--checkpoint DIR", 2)[-1].split("\n  --", 1)[0]
    assert "default: DAYZERO_CHECKPOINT, else the built-in" in " ".join(option.split())
    gone = tmp_path / "gone"
    ran = run_dayzero(
        command,
        *(["--prompt-ids", "1"] if command == "generate" else ["--port", "1"]),
        env={**os.environ, "DAYZERO_CHECKPOINT": str(gone)},
    )
    assert ran.returncode == 2 and f"checkpoint directory {gone} does not exist" in ran.stderr


def _settings_entry(name: str) -> str:
    """One DAYZERO_* entry of ``--help``'s settings list, its wrapped lines joined (an entry starts a line:
    another's text may name it)."""
    entry = settings_help().split(f"\n  {name} ", 1)[1].split("\n  DAYZERO_", 1)[0]
    return " ".join(entry.split())


def test_settings_help_states_no_default_that_another_setting_changes():
    """``up --help`` said DAYZERO_HANDOFF's default was shm, which DAYZERO_DEVICE=cuda makes cuda_ipc, and
    DAYZERO_MAX_CONTEXT's 65536, which a model of a shorter context serves as its own."""
    handoff = _settings_entry("DAYZERO_HANDOFF")
    assert f"(default {Settings().handoff})" not in handoff
    assert f"{Settings(device='cuda').handoff} with DAYZERO_DEVICE=cuda" in handoff
    assert "the model's own context when shorter" in _settings_entry("DAYZERO_MAX_CONTEXT")


BOUND = (  # "1 to 4096", "at least 784", "above 0", "above 0, at most 600", "at most 2"
    r"(?:(?P<from>[0-9.]+) to (?P<to>[0-9.]+)|(?:at least (?P<least>[0-9.]+)|above (?P<above>[0-9.]+))"
    r"(?:, at most (?P<most>[0-9.]+))?|at most (?P<only_most>[0-9.]+))"
)
# settings the others' checks would refuse at some edge: CUDA (a memory fraction), a chunk no larger than a step
EDGE_SETTINGS = {"device": "cuda", "prefill_chunk_size": 1, "max_prefill_tokens": 10**9}


@pytest.mark.parametrize(
    "name", [n for n, f in Settings.model_fields.items() if f.metadata and f.annotation in (int, float, int | None)]
)
def test_settings_help_states_each_bound_a_value_is_refused_past(name):
    """``--help`` named a bound only where a description happened to (DAYZERO_KV_MEMORY_FRACTION's 0.95,
    DAYZERO_LEASE_S's 600, DAYZERO_MAX_BATCH's 4096 were refused at start with bounds it never named): each
    bound it states holds a value at it (or just past an open one) and refuses one past it; a side it states
    no bound on holds a value far out (a bound left out of the text: "above 0" for DAYZERO_LEASE_S's range)."""
    entry = _settings_entry(f"DAYZERO_{name.upper()}")
    stated = re.search(rf"\({BOUND}(?:; default [^)]*)?\)$", entry)
    assert stated, entry
    number = float if Settings.model_fields[name].annotation is float else int
    step = 0.01 if number is float else 1
    low = stated["from"] or stated["least"]
    high = stated["to"] or stated["most"] or stated["only_most"]
    edges = [(number(low), number(low) - step)] if low else []
    edges += [(number(stated["above"]) + step, number(stated["above"]))] if stated["above"] else []
    edges += [(number(high), number(high) + step)] if high else []
    assert edges
    assert not high or len(re.findall(rf"(?<![0-9.]){re.escape(high)}(?![0-9.])", entry)) == 1, entry  # said once
    edges += [] if high else [(number(10**9), None)]
    edges += [] if low or stated["above"] else [(number(-(10**9)), None)]
    for held, refused in edges:
        assert getattr(Settings(**EDGE_SETTINGS | {name: held}), name) == held
        if refused is None:
            continue
        with pytest.raises(ValueError, match="greater than|less than"):
            Settings(**EDGE_SETTINGS | {name: refused})


@pytest.mark.parametrize(
    ("limits", "said"), [({"gt": 0, "lt": 1}, "above 0, below 1"), ({"ge": 1, "lt": 8}, "at least 1, below 8")]
)
def test_a_bound_of_each_kind_is_stated(limits, said):
    """A setting's ``lt`` was left out of its help ("above 0" for a range above 0, below 1): none has one
    yet, the next would have been refused at start past a bound --help never named."""
    assert _bounds(Field(**limits).metadata) == said


def test_quantize_help_names_the_in_its_out_refers_to():
    """OUT's help said "not IN" under a usage line that named them ``input output`` (the README's IN OUT)."""
    helped = run_dayzero("quantize", "--help").stdout
    usage = " ".join(helped.split("\n\n", 1)[0].split())
    assert "(not IN," in helped and usage.endswith(" IN OUT")


def _readme_synopsis() -> dict[str, str]:
    """The README's command block: each ``dayzero COMMAND ...`` line (continuations joined, comments cut)."""
    from .test_readme import README

    block = README.split("```sh\ndayzero up", 1)[1].split("```", 1)[0]
    lines = ("dayzero up" + block).replace("\\\n", " ").splitlines()
    synopsis = [line.split("#", 1)[0].strip() for line in lines if line.startswith("dayzero ")]
    return {line.split()[1]: line for line in synopsis if not line.split()[1].startswith("-")}


def _positionals_and_options(synopsis: str) -> tuple[list[str], set[str]]:
    """A usage line's positionals (outside every bracket, in order; ``a | b`` read as ``a|b``) and its
    options with their values (``--tokens N``, ``--experts fp4|fp8``, ``--json``)."""
    positionals, depth = [], 0
    for word in re.sub(r"\s*\|\s*", "|", synopsis).split()[2:]:  # (after ``dayzero COMMAND``)
        depth += word.count("[") + word.count("(")
        if depth == 0 and not word.startswith("-"):
            positionals.append(word)
        depth -= word.count("]") + word.count(")")
    return positionals, set(re.findall(r"--[a-z0-9-]+(?: [^\s\[\]()|-][^\s\[\]()]*)?", synopsis))


@pytest.mark.parametrize("command", sorted(_readme_synopsis()))
def test_help_s_usage_line_is_the_readme_s(command):
    """``inspect --help`` wrote ``dayzero inspect ... path`` where the README writes ``dayzero inspect
    CHECKPOINT | CONFIG | ...``, ``align`` ``checkpoint``, ``doctor`` ``url``, ``serve`` ``{gateway,...}``;
    earlier ``doctor --help`` showed ``--timeout TIMEOUT``, ``inspect --help`` ``--batch BATCH`` (the
    README's S and B): each usage line has the README's positionals, in its order, and its options
    with their values, no more, no fewer."""
    from dayzero.cli import parser

    usage = parser()._subparsers._group_actions[0].choices[command].format_usage()
    shown = _positionals_and_options(" ".join(usage.split()[1:]))
    assert shown == _positionals_and_options(_readme_synopsis()[command])


def _plan(checkpoint, env: dict[str, str]) -> dict:
    return json.loads(run_dayzero("inspect", str(checkpoint), "--json", env=env).stdout)


@pytest.fixture(scope="module")
def plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DAYZERO_")}  # no setting of the shell's


@pytest.fixture(scope="module")
def plain_plan(mtp_checkpoint, plain_env) -> dict:
    """``inspect``'s plan with no DAYZERO_* set (each run starts torch: once for the module)."""
    return _plan(mtp_checkpoint, plain_env)


@pytest.fixture(scope="module")
def inspect_help() -> str:
    return " ".join(run_dayzero("inspect", "--help").stdout.split())


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DAYZERO_DTYPE", "bfloat16"), ("DAYZERO_SPECULATIVE_TOKENS", "2"), ("DAYZERO_BLOCK_SIZE", "1000")],
)
def test_inspect_help_names_each_setting_its_plan_follows(
    variable, value, mtp_checkpoint, plain_env, plain_plan, inspect_help
):
    """``inspect --help`` named no setting, while its plan follows DAYZERO_DTYPE (the weights' and state's
    width), DAYZERO_SPECULATIVE_TOKENS (the MTP layer's state) and DAYZERO_BLOCK_SIZE (the pools' blocks:
    1000 rows, a tiny model's state that shows in GiB): the same command planned differently in two
    shells, nothing on screen saying why."""
    assert _plan(mtp_checkpoint, {**plain_env, variable: value}) != plain_plan  # the setting changes the plan
    assert variable in inspect_help
