"""``dayzero`` (the console script) and ``python -m dayzero``: Ctrl-C is handled from the first line.
Importing the commands takes ~1 s (2 s under load): a SIGINT then was a KeyboardInterrupt's traceback,
and a background job's (``dayzero up &`` inherits SIGINT ignored; ``up`` handles it only once its
command runs) was lost: up went on to start its stack."""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # (the disposition of a foreground run)
    try:
        from .cli import main as run
    except KeyboardInterrupt:  # as cli.main says it
        print("\ninterrupted", file=sys.stderr)
        return 130
    if inherited is not None:  # (a background job's SIG_IGN: a command that handles no SIGINT keeps it)
        signal.signal(signal.SIGINT, inherited)
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
