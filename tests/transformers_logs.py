"""Commands run through cli.main in the test's process, as ``python -m dayzero.cli`` would run them: the log
handlers transformers makes as it loads made before any test's ``capsys`` (conftest's fixture), and the
warnings such a process would print to stderr (pytest records them instead)."""

from __future__ import annotations

import logging
import warnings

import pytest

LOGGERS = ("transformers", "huggingface_hub", "ContinuousBatchingLogger")


@pytest.fixture(scope="session")
def transformers_logs() -> None:
    """transformers' log handlers (its own, huggingface_hub's, ContinuousBatchingLogger's) made outside any
    test: each keeps the sys.stderr of the moment its module loads, and a ``capsys`` one closes with its test
    (a command in the test's process loading transformers first left every later warning in the worker a
    "--- Logging error ---" traceback). Ask for it before ``capsys``."""
    from transformers import DeepseekV4ForCausalLM  # noqa: F401 - its import makes the handlers


def transformers_loggers_on_closed_streams(transformers_logs: None) -> list[str]:
    """transformers' loggers whose handler writes to a closed stream (a test after one that ran a command
    in its process asks: ``capsys`` closed that test's stream)."""
    assert all(logging.getLogger(n).handlers for n in LOGGERS)
    return [n for n in LOGGERS for h in logging.getLogger(n).handlers if getattr(h, "stream", None) and h.stream.closed]


# the categories Python's default filters hide from a process's stderr
UNSHOWN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def shown_warnings(recorded: list[warnings.WarningMessage]) -> list[str]:
    """What of the test's recorded warnings (``recwarn``) ``python -m dayzero.cli`` prints to stderr: the
    subprocess tests' "stderr is the one error line" and "no Traceback" saw them, capsys does not."""
    return [f"{w.category.__name__}: {w.message}" for w in recorded if not issubclass(w.category, UNSHOWN)]
