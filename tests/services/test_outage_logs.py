"""A worker's log through a Redis outage: a line when it begins, one per 10 s with a count, one when
Redis answers again (was: the decode loop's "redis unavailable; retrying" every 0.5 s, prefill's
"metrics not published" every quarter lease: 100 and 167 lines in a 35 s outage at a 1 s lease).
Celery's own lines too: its consumer's first, then a count per 10 s, and its "Connected to" (was:
"Cannot connect to ... Trying again in N seconds" at each try, 2, 4, 6, ... s apart: 32 lines a
worker in a 30 s outage). Real processes: Redis (killed, then restarted on its port), a gateway, a
prefill and a decode worker."""

from __future__ import annotations

import logging

from dayzero.serving.outage_log import BrokerOutageFilter, OutageLog

from .conftest import start_stack, wait_until
from .launch import stream_in_flight

# the places a worker's outage is said: its first line, the count of those since, the line once back
PLACES = {
    "loop": ("redis unavailable (", "more passes of the loop failed", "the loop reaches Redis again after"),
    "metrics": ("metrics not published (Redis: ", "more beats' metrics not published", "metrics published again after"),
}
CELERY_TRIES = "consumer: Cannot connect to "  # Celery's line at each try to connect again (3 lines)
CELERY_BACK = "Connected to "


def _counted(log) -> list[str]:
    """The places whose outage ``log`` said, then counted (the loop fails every 0.5 s, metrics every
    quarter lease; which fails first in an idle prefill worker's pass is the timing's)."""
    text = log.read_text()
    return [place for place, (first, counted, _) in PLACES.items() if first in text and counted in text]


def _said_once(log) -> bool:
    text = log.read_text()
    return all(text.count(first) <= 1 for first, _, _ in PLACES.values())


def _warnings(log) -> str:
    """The worker's warnings and errors, its last 30."""
    return "\n".join([line for line in log.read_text().splitlines() if "WARNING/" in line or "ERROR/" in line][-30:])


def test_a_redis_outage_is_a_few_lines_in_each_workers_log(text_dir, tmp_path):
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1})
    try:
        decode, prefill = tmp_path / "decode0.log", tmp_path / "prefill0.log"
        assert stream_in_flight(stack.url, 120).wait(60)
        stack.redis.kill()
        stack.redis.wait()
        said = wait_until(lambda: "loop" in _counted(decode) and _counted(prefill), 45)  # (decode: a stream's steps)
        assert said, f"decode:\n{_warnings(decode)}\nprefill:\n{_warnings(prefill)}"
        assert _said_once(decode) and _said_once(prefill)
        backs = [(log, PLACES[place][2]) for log in (decode, prefill) for place in _counted(log)]
        connected = {log: log.read_text().count(CELERY_BACK) for log in (decode, prefill)}
        assert stack.supervise() == ["redis"]
        stack.until_ready("redis", 60)
        stack.wait_ready(timeout_s=60)  # the workers reconnected
        for log, back in backs:
            assert wait_until(lambda log=log, back=back: back in log.read_text(), 30), back
        for log, before in connected.items():  # (Celery's next try: within a second)
            assert wait_until(lambda log=log, before=before: log.read_text().count(CELERY_BACK) > before, 30)
    finally:
        stack.stop()
    assert _said_once(decode) and _said_once(prefill)  # (and once back)
    for log in (decode, prefill):  # >= 10 s out: Celery tried each second (was: a line each)
        assert log.read_text().count(CELERY_TRIES) <= 1, _warnings(log)
        assert "Celery's lines about it held back" in log.read_text(), _warnings(log)


class _Timers:
    """``later`` for an OutageLog whose timers the test runs by hand."""

    def __init__(self) -> None:
        self.due: list = []

    def __call__(self, delay_s: float, call):
        self.due.append(call)
        return self

    def cancel(self) -> None:
        self.due.clear()

    def run(self) -> None:
        due, self.due = self.due, []
        for call in due:
            call()


def _outage(timers: _Timers) -> OutageLog:
    log = logging.getLogger("test.outage")
    return OutageLog(log, "down (%s)", "%d more", "back after %.0f s (%d more)", 60, timers)


def test_an_outage_log_says_its_start_counts_its_middle_and_says_its_end(caplog):
    timers = _Timers()
    outage = _outage(timers)
    with caplog.at_level("WARNING", "test.outage"):
        for _ in range(5):
            outage.failed("refused")
        timers.run()  # the every_s is over: the four since the first are counted
        outage.failed("refused")
        outage.back()
        outage.back()  # (nothing failed since: no line)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["down (refused)", "4 more", "back after 0 s (1 more)"]


def test_passes_that_flap_between_failing_and_not_reaching_redis_log_a_line_per_period(caplog):
    """A loop whose idle passes reach no Redis calls ``back`` between its failures: within the
    period after the last line, neither the failures nor their ends are said at once."""
    timers = _Timers()
    outage = _outage(timers)
    with caplog.at_level("WARNING", "test.outage"):
        outage.failed("refused")
        outage.back()
        for _ in range(10):
            outage.failed("refused")
            outage.back()
        timers.run()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["down (refused)", "back after 0 s (0 more)", "10 more"]


def _celerys(logger: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(logger, level, __file__, 0, message, (), None)


def test_celerys_lines_of_a_lost_connection_are_its_first_a_count_and_its_connected_line(caplog):
    timers, lost, back = _Timers(), BrokerOutageFilter.LOST, BrokerOutageFilter.BACK
    held = BrokerOutageFilter(logging.getLogger("test.outage"), 60, timers)
    with caplog.at_level("WARNING", "test.outage"):
        passed = [held.filter(_celerys(lost, "Connection to broker lost", logging.WARNING))]
        passed += [held.filter(_celerys(lost, "Cannot connect to redis://")) for _ in range(4)]
        passed.append(held.filter(_celerys(lost, "Skipping prefetch count reduction", logging.INFO)))
        timers.run()  # the period is over: the tries since the first are counted
        passed.append(held.filter(_celerys(lost, "Cannot connect to redis://")))
        passed.append(held.filter(_celerys(back, "Connected to redis://", logging.INFO)))
    assert passed == [True, False, False, False, False, True, False, True]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "4 more of Celery's broker connection lines held back since the last"
    assert lines[1].startswith("the broker connection is back after 0.0 s (1 more of Celery's lines")
