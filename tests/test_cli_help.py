"""What ``--help`` says a default is, the command does (run as a user runs it)."""

from __future__ import annotations

import os

import pytest

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
