"""Constrained decoding: a request's grammar (llguidance) decides which tokens may come next.

The grammar travels with the request as Lark text (plain data on the broker); each stage that
samples rebuilds its matcher and replays the tokens generated so far, so the state follows the
request across prefill, decode and a re-run after a failure. A grammar is compiled once per
process (grammars.py: in the background, cached by its text) and each request's matcher starts
from a copy of it. ``allowed_logits`` masks a whole
batch in one go: the masks of all constrained rows are computed in parallel (llguidance's
executor, outside the GIL) into one bitmask [R, ceil(V/32)] int32, then applied by one masked fill.
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import torch

from .chat.grammar import LEXER_ERROR, error_summary
from .grammars import Grammars
from .params import Grammar

if TYPE_CHECKING:
    from .serving.metrics import WorkerStats

GRAMMAR_FAILED = "grammar_failed"  # the code of a request's end its grammar failed by itself (the gateway's 400)


class GrammarFailed(ValueError):
    """The grammar failed mid-reply: the request fails rather than finish with "stop" (the end an
    empty mask forces is not a valid reply). ``code``: ``GRAMMAR_FAILED`` when it failed by itself
    (past a limit of llguidance's parser or lexer, such as a pattern too big for its lexer or a
    schema nothing finite satisfies, a required property whose ``$ref`` is its own object: the
    request's schema, as the gateway's checks refuse most before it queues), "" when it refused a
    token it was given (one its mask did not allow: the server's fault)."""

    def __init__(self, why: str) -> None:
        self.code = "" if _REFUSED in why else GRAMMAR_FAILED
        what = "the grammar refused the token sampled" if not self.code else "its grammar failed mid-reply"
        super().__init__(f"{what}: {why}")


class LexerFilled(GrammarFailed):
    """Its compile's lexer is full: every matcher of a compile shares its lexer, whose states the
    replies grow (llguidance's ``deep_copy``), so this is other requests' doing as much as its own.
    The request carries on on a fresh compile (``Guide.renew``: decode's steps and its replay at
    admission, prefill's first token and a re-run's replay before it)."""


_REFUSED = "doesn't satisfy the grammar"  # llguidance's error for a token it refuses ("Parser Error: token ...")


def failed_alone(stats: WorkerStats, rid: str, exc: Exception, what: str, counted: bool) -> None:
    """Log ``exc``, which failed request ``rid``'s own sampling (or handoff) in the stage ``stats``
    counts for (``what``: "sampling failed", ...), and count it where this worker wrote its end
    (``counted``: not where its settle was STALE, the request re-run since, whose end counts it):
    its schema's failure is the client's error (INFO, ``grammar_failures``: a client can send such
    schemas at will), any other the stage's (ERROR with its stack, an operator failure: logged here
    even uncounted, the re-run's end says nothing of it)."""
    log = logging.getLogger(f"dayzero.{stats.stage}")
    stale = "" if counted else " (its run was re-run meanwhile: its end is the re-run's)"
    if isinstance(exc, GrammarFailed) and exc.code == GRAMMAR_FAILED:
        log.info("request %s: %s: %s%s", rid, what, exc, stale)
        if counted:
            stats.add(grammar_failures=1)
    else:
        log.error("request %s: %s%s", rid, what, stale, exc_info=exc)
        if counted:
            stats.fail(stats.stage)


def failure(exc: Exception, what: str) -> tuple[str, str]:
    """The message and code of the end ``exc`` gives its request (``failed_alone``'s ``exc``): a failed
    grammar's own (it says why), else ``what`` and the exception's type."""
    return (str(exc), exc.code) if isinstance(exc, GrammarFailed) else (f"{what}: {type(exc).__name__}", "")


class Guide:
    """One request's grammar state, advanced by each accepted token."""

    def __init__(self, grammars: Grammars, grammar: Grammar, compiled: Future | None = None) -> None:
        self._grammars, self._lark = grammars, grammar.lark
        # (``compiled``: Grammars.compiled's, held; the one a lexer filled by replies retires: ``accept``)
        self._compiled = compiled if compiled is not None else grammars.compiling(grammar.lark)
        self.matcher = grammars.matcher(grammar.lark, self._compiled)
        self.words = (grammars.tokenizer.vocab_size + 31) // 32  # the mask's int32 words: the tokenizer's vocabulary
        if self.matcher.is_error():
            raise ValueError(f"invalid grammar: {error_summary(self.matcher.get_error())}")
        self._after = grammar.after
        self.active = grammar.after is None
        self._consumed: list[int] = []  # the tokens its matcher took: replayed into a fresh compile's
        # (len(_consumed), own) at its last ``renew``, while it decides whose a lexer's failure at that
        # token is: its own (a fresh compile), or not (one others copied: their states in its lexer)
        self._renewed: tuple[int, bool] | None = None
        self.filled: LexerFilled | None = None  # its compile's lexer filled: it waits for a fresh one (``renew``)

    def accept(self, token: int) -> None:
        """Advance by ``token``; ``GrammarFailed`` when the grammar has failed (its mask admitted
        nothing: ``token`` is the end that forced) or fails on it (it is not streamed):
        ``LexerFilled`` when its compile's lexer is full (``renew`` carries on). While it waits for a
        fresh compile, ``token`` is only kept for it (a replay's: the tokens streamed before)."""
        if self.filled is not None:
            self._consumed.append(token)
        elif self.active:
            if not self.matcher.is_error() and not self.matcher.is_stopped():
                self.matcher.consume_token(token)  # a token it refuses leaves it in its error state
            if self.matcher.is_error():
                self._failed()
            self._consumed.append(token)
        elif token == self._after:
            self.active = True

    def renew(self, compiled: Future, held: bool = True) -> None:
        """Take ``compiled``, a fresh compile of its grammar that the caller saw ready and holds
        (``Runtime.grammar_ready``: the cache may drop it once seen ready, and asked again it compiled
        anew), replaying the tokens it took into its copy. A lexer's failure on a compile no other
        matcher was copied from is the grammar's own (``GrammarFailed``: a reply that alone fills a
        fresh lexer, ``_failed``); on one others share, it is ``LexerFilled`` again (that compile
        retired), once per token: failing so twice at one token is its own (K bad replies at once
        wait for 2 compiles, not K in turn). ``held``: the step that failed is taken next, before
        others copy this compile (not: a replay's, whose next token is a later step's)."""
        at = len(self._consumed)
        # (a compile others copied is no fresh one, unless it renewed at this token on one already)
        own = not self._grammars.copies(compiled) or self._renewed == (at, False)
        self._renewed = (at, own)
        self.matcher, self._compiled = self._grammars.matcher(self._lark, compiled), compiled
        self.matcher.consume_tokens(self._consumed)
        self.filled = None
        if self.matcher.is_error():
            self._failed()
        if not held and own:  # (a replay's: its next token is a step's, tried after others copied it)
            self._renewed = None

    def _failed(self) -> None:
        """Raise its matcher's error: a lexer's retires the compile (every copy's lexer), and is the
        request's own on a compile no other matcher was copied from (its lexer holds this reply's
        states alone), or at the token of a renew that counts as fresh."""
        error = self.matcher.get_error()
        if not error.startswith(LEXER_ERROR):
            raise GrammarFailed(error_summary(error))
        self._grammars.retire(self._lark, self._compiled)
        if self._grammars.copies(self._compiled) == 1 or self._renewed == (len(self._consumed), True):
            raise GrammarFailed(error_summary(error))
        self.filled = LexerFilled(error_summary(error))
        raise self.filled


@functools.cache
def _executor():
    import llguidance

    return llguidance.LLExecutor()


# byte value -> its 8 bits, lowest first: unpacks a little-endian bitmask by one gather (on a GPU)
_BYTE_BITS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool()  # [256, 8]


def allowed_logits(logits: torch.Tensor, guides: list[Guide | None], eos: int) -> torch.Tensor:
    """``logits`` [B, V] with every token a row's grammar forbids at -inf (the same tensor when no
    row is constrained). A row whose grammar has failed may only end (``eos``: accepting it raises
    ``GrammarFailed``, and that request fails alone); a row whose grammar
    waits for its opening token (an answer after a thought) may be anything but ``eos``: the
    constrained answer it owes must come (or the length limit end it)."""
    rows = [i for i, g in enumerate(guides) if g is not None and g.active]
    pending = [i for i, g in enumerate(guides) if g is not None and not g.active]
    if pending:
        logits = logits.clone()
        logits[torch.tensor(pending, device=logits.device), eos] = float("-inf")
    if not rows:
        return logits
    return apply_masks(logits, rows, fill_masks([guides[i] for i in rows]), eos)


def fill_masks(guides: list[Guide]) -> torch.Tensor:
    """The guides' next-token masks [R, words] int32 (bit ``t % 32`` of word ``t // 32``: token
    ``t`` allowed), computed in parallel outside the GIL."""
    bitmask = torch.empty((len(guides), guides[0].words), dtype=torch.int32)
    matchers = [(g.matcher, j) for j, g in enumerate(guides)]
    _executor().unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), bitmask.shape[1] * 4, len(guides))
    return bitmask


def apply_masks(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor, eos: int) -> torch.Tensor:
    """A copy of ``logits`` [B, V] with rows ``rows`` (ascending) masked by ``bitmask`` [len(rows),
    words]: on a CPU by numpy (its unpack and select run 2-10x torch's there, bench/guided.py), on
    a GPU by torch on the logits' device."""
    every, at = len(rows) == logits.shape[0], torch.tensor(rows, device=logits.device)
    values = logits if every else logits[at]  # [R, V]
    on_cpu = values.device.type == "cpu" and values.dtype in (torch.float16, torch.float32, torch.float64)
    masked = (_masked_numpy if on_cpu else _masked_torch)(values, bitmask, eos)
    if every:  # (no copy of the batch to fill)
        return masked
    out = logits.clone()
    out[at] = masked
    return out


def _masked_numpy(values: torch.Tensor, bitmask: torch.Tensor, eos: int) -> torch.Tensor:
    vocab = values.shape[-1]
    bits = np.unpackbits(
        bitmask.numpy().view(np.uint8), axis=1, count=min(vocab, 32 * bitmask.shape[1]), bitorder="little"
    )
    allowed = bits.view(bool)  # [R, <= V]
    if allowed.shape[1] < vocab:  # ids past the tokenizer's vocabulary (a padded embedding): never allowed
        allowed = np.pad(allowed, ((0, 0), (0, vocab - allowed.shape[1])))
    allowed[:, eos] |= ~allowed.any(axis=1)  # a row allowing nothing may only end
    array = values.numpy()
    return torch.from_numpy(np.where(allowed, array, np.array(-np.inf, dtype=array.dtype)))


def _masked_torch(values: torch.Tensor, bitmask: torch.Tensor, eos: int) -> torch.Tensor:
    vocab, device = values.shape[-1], values.device
    allowed = _BYTE_BITS.to(device)[bitmask.to(device).view(torch.uint8).long()].flatten(1)  # [R, 32 * words]
    allowed = torch.nn.functional.pad(allowed, (0, max(vocab - allowed.shape[1], 0)))[:, :vocab]  # [R, V]
    allowed[:, eos] |= ~allowed.any(dim=1)
    return torch.where(allowed, values, float("-inf"))
