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
