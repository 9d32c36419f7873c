"""Compiled grammars: llguidance compiles a request's grammar once per process, off the serving
loops, and each request's matcher starts from a copy."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

from .chat.grammar import parser_limits


class Grammars:
    """A process's compiled grammars over one tokenizer (an ``LLTokenizer``), by their text, the
    ``cached`` latest used kept. Each is compiled once, in a thread of its own (llguidance releases
    the GIL while it compiles: seconds for a schema of thousands of properties, bench/guided.py), so
    a serving loop need never wait for one: it admits a request once its grammar is ``ready``, and
    the request's matcher is a copy of the compiled one (``deep_copy``: well under the compile's
    time). Requests repeating a grammar (one application's tools or reply schema) compile it once."""

    def __init__(self, tokenizer, cached: int = 32, threads: int = 2) -> None:
        self.tokenizer = tokenizer
        self._cached, self._threads = cached, threading.BoundedSemaphore(threads)  # compiles at once
        self._compiled: OrderedDict[str, Future] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def ready(self, lark: str) -> bool:
        """Whether ``lark`` is compiled (or failed to compile); the first call starts compiling it."""
        return self._compiling(lark).done()

    def matcher(self, lark: str):
        """A matcher of ``lark`` at its start, the caller's own (waits for the compile if not ready:
        a matcher in its error state when the grammar is refused)."""
        return self._compiling(lark).result().deep_copy()

    def _compiling(self, lark: str) -> Future:
        with self._lock:
            future = self._compiled.pop(lark, None)
            if future is None:
                future = Future()
                threading.Thread(target=self._compile, args=(lark, future), name="grammar", daemon=True).start()
            self._compiled[lark] = future
            while len(self._compiled) > self._cached:
                self._compiled.popitem(last=False)
            return future

    def _compile(self, lark: str, future: Future) -> None:
        import llguidance

        with self._threads:
            try:
                future.set_result(llguidance.LLMatcher(self.tokenizer, lark, log_level=0, limits=parser_limits()))
            except BaseException as exc:  # noqa: BLE001 - the waiter's to raise
                future.set_exception(exc)
