"""What a command, or a module the light ones import, loads in a fresh interpreter: each heavy module
named here cost its CPU time at every start that needs none of it."""

from __future__ import annotations

import json

from .conftest import fresh_python


def _loaded(imports: str, heavy: tuple[str, ...]) -> list[str]:
    """Which of the ``heavy`` modules a fresh interpreter that ran ``imports`` has loaded."""
    listed = f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    return json.loads(fresh_python(f"import json, sys\n{imports}\n{listed}"))


def test_the_kv_budget_imports_no_completion():
    """serving.budget (``up``'s plan of its workers' pools) imported dayzero.completion for its one-line
    ``context_limit``, and with it the tokenizer, the guided-decoding grammars and sampling."""
    heavy = ("dayzero.completion", "dayzero.guided", "dayzero.sampling", "dayzero.tokenizer", "tokenizers")
    assert _loaded("import dayzero.serving.budget", heavy) == []


def _running(runs: str, codes: list[int]) -> str:
    """Code that runs ``dayzero`` with each argv of ``runs`` (a Python expression), quietly, in turn, and
    checks that they exited with ``codes``."""
    return f"""
import contextlib, io
from dayzero import cli
from dayzero.procs import free_port
codes = []
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for argv in {runs}:
        try:
            codes.append(cli.main(argv))
        except SystemExit as exit:  # (--help's)
            codes.append(exit.code)
assert codes == {codes!r}, codes
"""


SERVICES_ONLY = ("redis", "PIL", "opentelemetry")  # the queue's client, its telemetry, images
RUN_COMMANDS = _running(  # (doctor: no gateway at that port)
    """[["--help"], ["inspect", "--help"], ["inspect", "deepseek-v4-flash"], ["doctor", f"http://127.0.0.1:{free_port()}"]]""",
    [0, 0, 0, 1],
)


def test_help_inspect_and_doctor_import_neither_redis_nor_pillow():
    """Every command imported redis-py, and with it the OpenTelemetry SDK (redis-py's observability), for
    ``Settings``' check of DAYZERO_REDIS_URL (and ``up``'s Redis watch, imported with the parser), and
    Pillow for the image limits' dataclasses: ``--help``, ``inspect`` and ``doctor`` use none of them."""
    assert _loaded(RUN_COMMANDS, SERVICES_ONLY) == []


def test_generate_imports_neither_redis_nor_pillow(tiny_checkpoint):
    """``generate`` (in this process, no queue, no image) imported the workers' rank loading for its
    attention options (a two-field dataclass), and with it redis-py, the OpenTelemetry SDK, and through
    the prefill step's image splice, Pillow."""
    generate = f"[['generate', '--checkpoint', {str(tiny_checkpoint)!r}, '--prompt-ids', '1,2', '--max-tokens', '2']]"
    assert _loaded(_running(generate, [0]), SERVICES_ONLY) == []
