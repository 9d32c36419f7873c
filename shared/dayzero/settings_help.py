"""What an operator reads about the settings: ``--help``'s list of them, a warning for each
DAYZERO_* variable that is none (a misspelt one would be ignored without a word), and one line
naming each bad value (``settings_from_env``)."""

from __future__ import annotations

import difflib
import re
import textwrap
from collections.abc import Mapping

import annotated_types
from pydantic import ValidationError
from pydantic_settings import SettingsError

from .redis_urls import without_password
from .settings import Settings

HELP_WIDTH = 100  # columns of the --help texts argparse prints unwrapped (the settings, a long description)
COMPOSE_VARIABLES = ("DAYZERO_CHECKPOINT_DIR",)  # read by docker-compose.yml on the host, not by dayzero
SECRETS = ("api_keys",)  # settings whose refused values are not printed (they were, keys and all)
# defaults that follow another setting or the checkpoint: --help said "(default shm)" of a handoff that is
# cuda_ipc with DAYZERO_DEVICE=cuda, and "(default 65536)" of a context that is the model's when shorter
FOLLOWING_DEFAULTS = {
    "handoff": "the device's own: shm, cuda_ipc with DAYZERO_DEVICE=cuda",
    "max_context": "65536, or the model's own context when shorter",
    "kv_budget_mb": "on CPU the least holding DAYZERO_MAX_BATCH windows and one sequence of the context limit, "
    "or 256 if more; on CUDA DAYZERO_KV_MEMORY_FRACTION of the device less what the worker's weights hold, "
    "one refusing to start where that is less than the CPU's least",
}


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
        shown = FOLLOWING_DEFAULTS.get(name, field.default)
        said = [s for s in (_bounds(field.metadata), None if shown is None else f"default {shown}") if s]
        variable, text = f"  DAYZERO_{name.upper():<28} ", field.description + (f" ({'; '.join(said)})" if said else "")
        lines += textwrap.wrap(text, width, initial_indent=variable, subsequent_indent=" " * len(variable))
    return "\n".join(lines)


BOUND_WORDS = {  # a numeric constraint kind (pydantic's ge, gt, le, lt) -> its words, lower bounds first
    annotated_types.Ge: "at least",
    annotated_types.Gt: "above",
    annotated_types.Le: "at most",
    annotated_types.Lt: "below",
}


def _bounds(constraints: list) -> str:
    """A setting's range as its validation refuses values outside it ("1 to 4096", "above 0, at most 600",
    "at least 784", "below 1"); empty for none (the help named a bound only where its text happened to)."""
    bound = {type(c): getattr(c, type(c).__name__.lower()) for c in constraints if type(c) in BOUND_WORDS}
    if annotated_types.Ge in bound and annotated_types.Le in bound:
        return f"{bound[annotated_types.Ge]} to {bound[annotated_types.Le]}"
    return ", ".join(f"{words} {bound[kind]}" for kind, words in BOUND_WORDS.items() if kind in bound)


def settings_from_env() -> Settings:
    """The process's settings; a ValueError of one line naming each bad DAYZERO_* variable."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ValueError("; ".join(map(_problem, exc.errors()))) from None
    except SettingsError as exc:  # a value the source could not decode; its message holds 'field "name"'
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"DAYZERO_{field[1].upper()}" if field else "a DAYZERO_* variable"
        raise ValueError(f"{name} could not be parsed: {exc.__cause__ or exc}") from None


def validation_message(error: dict) -> str:
    """A pydantic error's message, without the prefix pydantic puts on a validator's ValueError."""
    return error["msg"].removeprefix("Value error, ")


def _problem(error: dict) -> str:
    """One validation error as the operator wrote it: ``DAYZERO_PORT=0: ...``, ``DAYZERO_API_KEYS[1]=1: ...``
    (an item of a list), or a check across variables, which names them itself."""
    message = validation_message(error)
    if not error["loc"]:
        return message
    field, *item = error["loc"]
    where, value = "".join(f"[{i}]" for i in item), error.get("input")
    shown = without_password(value) if isinstance(value, str) else value  # (a Redis URL's password)
    shown = "***" if field in SECRETS else repr(shown)
    return f"DAYZERO_{str(field).upper()}{where}={shown}: {message}"
