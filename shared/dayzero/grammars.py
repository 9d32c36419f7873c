"""Compiled grammars: llguidance compiles a request's grammar once per process, off the serving
loops, and each request's matcher starts from a copy."""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future

from .chat.grammar import parser_limits


class Grammars:
    """A process's compiled grammars over one tokenizer (an ``LLTokenizer``), by their text: the
    ``cached`` latest used, and any used within ``kept_s`` (a request that waited for its grammar
    gets it from here a step or a prefill later: a burst of other grammars must not drop it), but
    never more than ``most`` compiled (a flood of distinct grammars holds no unbounded memory; those
    compiling stay, as many as the requests waiting for them). Each
    is compiled once, in a thread of its own (llguidance releases the GIL while it compiles:
    seconds for a schema of thousands of properties, bench/guided_compile.py), so a serving loop
    need never wait for one: it admits a request once its grammar is ``ready``, and the request's
    matcher is a copy of the compiled one (``deep_copy``: well under a millisecond). Requests
    repeating a grammar (one application's tools or reply schema) compile it once."""

    def __init__(self, tokenizer, cached: int = 32, kept_s: float = 300.0, threads: int = 2, most: int = 256) -> None:
        self.tokenizer = tokenizer
        self._cached, self._kept_s, self._most = cached, kept_s, max(cached, most)
        self._threads = threading.BoundedSemaphore(threads)  # compiles at once
        self._compiled: OrderedDict[str, tuple[Future, float, bool]] = OrderedDict()  # (compile, last use, seen done)
        self._retired: weakref.WeakSet[Future] = weakref.WeakSet()  # compiles whose lexer a reply filled
        self._copies: weakref.WeakKeyDictionary[Future, int] = weakref.WeakKeyDictionary()  # matchers of each
        self._lock = threading.Lock()

    def ready(self, lark: str) -> bool:
        """Whether ``lark`` is compiled (or failed to compile); the first call starts compiling it."""
        return self.compiled(lark) is not None

    def compiled(self, lark: str) -> Future | None:
        """``lark``'s compile once done (or failed), for the caller to hold till it takes its matcher
        (``matcher(lark, compiled)``): the cache may drop it meanwhile (``most`` others used since),
        and the matcher would wait for a compile again. None while it compiles (the first call
        starts it)."""
        future = self.compiling(lark)
        return future if future.done() else None

    def matcher(self, lark: str, compiled: Future | None = None):
        """A matcher of ``lark`` at its start, the caller's own, copied from ``compiled`` (if given;
        else ``compiling(lark)``'s), waited for if it compiles (a matcher in its error state when the
        grammar is refused)."""
        compiled = compiled if compiled is not None else self.compiling(lark)
        matcher = compiled.result().deep_copy()
        with self._lock:
            self._copies[compiled] = self._copies.get(compiled, 0) + 1
            if lark in self._compiled and self._compiled[lark][0] is compiled:  # (seen done: it may go)
                self._compiled[lark] = (compiled, self._compiled[lark][1], True)
        return matcher

    def copies(self, compiled: Future) -> int:
        """How many matchers were copied from ``compiled`` (``matcher``): its lexer, shared, holds
        the states of each."""
        with self._lock:
            return self._copies.get(compiled, 0)

    def retire(self, lark: str, compiled: Future | None) -> None:
        """Drop ``compiled``, ``lark``'s compile, if cached: a matcher of it failed on its lexer. Every
        copy shares the compile's lexer, whose states each reply grows (llguidance's ``deep_copy``):
        once replies filled it past ``max_lexer_states`` every request of the grammar failed, each
        of which a fresh compile writes whole, while the grammar stayed cached. The next compiles anew;
        a request holding it meanwhile takes the fresh one (``retired``: ``Runtime.grammar_ready``),
        and so does the one that found it full (renewed on it: ``Guide.renew``)."""
        with self._lock:
            if compiled is None:
                return
            self._retired.add(compiled)
            if self._compiled.get(lark, (None,))[0] is compiled:
                del self._compiled[lark]

    def retired(self, compiled: Future) -> bool:
        """Whether ``compiled`` was retired (``retire``): a request holding it asks ``compiled`` again."""
        with self._lock:
            return compiled in self._retired

    def compiling(self, lark: str) -> Future:
        """``lark``'s compile, done or not (the first call starts it): ``matcher`` waits for it."""
        now = time.monotonic()
        with self._lock:
            future, _, seen = self._compiled.pop(lark, (None, now, False))
            if future is None:
                future = Future()
                threading.Thread(target=self._compile, args=(lark, future), name="grammar", daemon=True).start()
            self._compiled[lark] = (future, now, seen or future.done())  # (this caller sees it done)
            self._drop_unused(now)
            return future

    def _drop_unused(self, now: float) -> None:
        """The least recently used compiled grammars go, past ``cached``, while more than ``most`` or
        unused for ``kept_s``; never one still compiling (some request waits for it: dropped, the next
        ``ready`` of it compiled it anew, and with more than ``most`` compiling at once each ``ready``
        dropped the one asked for next: none was ever ready, a thread more per call), nor one done
        that no caller has seen done yet, unless unused for ``kept_s`` (its waiter asks again: dropped
        as it finished, it compiled again, and so on while more than ``most`` waited)."""
        held, dropped = len(self._compiled), []
        for lark, (future, used, seen) in self._compiled.items():  # (oldest first: most calls look at one)
            if held <= self._cached or (held <= self._most and now - used <= self._kept_s):
                break
            if future.done() and (seen or now - used > self._kept_s):
                dropped.append(lark)
                held -= 1
        for lark in dropped:
            del self._compiled[lark]

    def _compile(self, lark: str, future: Future) -> None:
        import llguidance

        with self._threads:
            try:
                future.set_result(llguidance.LLMatcher(self.tokenizer, lark, log_level=0, limits=parser_limits()))
            except BaseException as exc:  # noqa: BLE001 - the waiter's to raise
                future.set_exception(exc)
