"""What an operator reads about the settings: ``--help``'s list of them, and a warning for each
DAYZERO_* variable that is none (a misspelt one would be ignored without a word)."""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Mapping

from .settings import Settings

HELP_WIDTH = 100  # columns of the --help texts argparse prints unwrapped (the settings, a long description)
COMPOSE_VARIABLES = ("DAYZERO_CHECKPOINT_DIR",)  # read by docker-compose.yml on the host, not by dayzero


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """A warning for each DAYZERO_* variable that is no setting (a misspelt one is otherwise
    ignored without a word), with the setting it most likely meant."""
    known = [name.upper() for name in Settings.model_fields]
    warnings = []
    for name in sorted(environ):
        setting = name.removeprefix("DAYZERO_")
        if setting != name and setting not in known and name not in COMPOSE_VARIABLES:
            near = difflib.get_close_matches(setting, known, n=1)
            warnings.append(f"{name} is not a setting" + (f" (did you mean DAYZERO_{near[0]}?)" if near else ""))
    return warnings


def settings_help(width: int = HELP_WIDTH) -> str:
    """Every setting as its environment variable, with its meaning and default (for --help), each
    wrapped to ``width`` columns under its description."""
    lines = ["settings (environment variables):"]
    for name, field in Settings.model_fields.items():
        default = "" if field.default is None else f" (default {field.default})"
        variable, text = f"  DAYZERO_{name.upper():<28} ", f"{field.description}{default}"
        lines += textwrap.wrap(text, width, initial_indent=variable, subsequent_indent=" " * len(variable))
    return "\n".join(lines)
