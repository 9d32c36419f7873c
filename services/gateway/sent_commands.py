"""The commands the reaper's passes send, by the names the refusals' record keeps them under
(refused_commands.py): a command Redis answered clears its refusal, so both are named alike. A
refusal was named as Redis names it and an answer as redis-py sends it: a subcommand's refusal
('script|load' to Redis 7, 'script' to Redis 6) never met its answer ('script load'), nor did one met
in a Lua script (the command the script called, or 'unnamed': Redis 6) its script's answer
('evalsha'); such a refusal, lifted, held till it lapsed (5 periods: 1,500 s at a 600 s lease)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import redis

from dayzero.redis_refusals import command_refused


def sent_name(args: tuple[object, ...]) -> str:
    """A command's name as sent (``execute_command``'s ``args``): a subcommand joined as the ACL joins it
    ('script|load'; redis-py sends 'SCRIPT LOAD'), a script by its SHA ('evalsha|<sha>': answered, it
    ran whatever it calls)."""
    name = str(args[0]).lower().replace(" ", "|")
    return f"{name}|{args[1]}" if name == "evalsha" else name


@dataclass(frozen=True, slots=True)
class Sent:
    """A refused command as sent: its name (``sent_name``), and the step of the pass it was sent at (None:
    outside one that a pass may skip)."""

    name: str
    step: str | None


@dataclass(slots=True)
class PassCommands:
    """One pass's commands (``sent_name``): those Redis answered, the refusals it met as they were sent,
    and the steps it skipped (``skipped``: a refusal met at one is held, the pass told nothing of it)."""

    answered: set[str] = field(default_factory=set)
    refused: list[tuple[BaseException, Sent]] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    step: str | None = None  # (the skippable step running: ``at``)

    def sent_as(self, refusal: BaseException) -> Sent | None:
        """How ``refusal``'s command was sent in this pass; None: not one of its commands."""
        return next((sent for met, sent in self.refused if met is refusal), None)

    @contextlib.contextmanager
    def at(self, step: str) -> Iterator[None]:
        """The commands of this block are sent at ``step``, one a pass may skip."""
        self.step = step
        try:
            yield
        finally:
            self.step = None


class SentCommands:
    """The commands sent on ``client`` in the thread that records (``recording``): the client's commands
    are seen where they all go (``execute_command``, a script's EVALSHA too; a pipeline's ``execute``:
    a transaction's MULTI and EXEC too), the steps left as they are. Other threads (requests) are not
    recorded. A pipeline's commands went unseen: a refused MULTI (the gateway's stamp, the stamps'
    read: transactions), lifted, held till it lapsed."""

    def __init__(self, client: redis.Redis) -> None:
        self._local = threading.local()
        execute, pipeline = client.execute_command, client.pipeline

        def execute_recorded(*args: object, **options: object) -> object:
            commands: PassCommands | None = getattr(self._local, "commands", None)
            try:
                answer = execute(*args, **options)
            except redis.RedisError as exc:
                if commands is not None and command_refused(exc):
                    commands.refused.append((exc, Sent(sent_name(args), commands.step)))
                raise
            if commands is not None:
                commands.answered.add(sent_name(args))
            return answer

        def pipeline_recorded(*args: object, **options: object) -> redis.client.Pipeline:
            pipe = pipeline(*args, **options)
            pipe.execute = self._recorded(pipe)
            return pipe

        client.execute_command, client.pipeline = execute_recorded, pipeline_recorded

    def _recorded(self, pipe: redis.client.Pipeline) -> Callable[..., list]:
        """``pipe.execute``, its answered commands recorded (a refusal: as Redis names it, refused_commands.py)."""
        execute = pipe.execute

        def execute_recorded(raise_on_error: bool = True) -> list:
            sent = [sent_name(args) for args, _ in pipe.command_stack] + (["multi", "exec"] if pipe.transaction else [])
            answers = execute(raise_on_error)
            if (commands := getattr(self._local, "commands", None)) is not None:
                failed = {name for name, answer in zip(sent, answers, strict=False) if isinstance(answer, Exception)}
                commands.answered |= set(sent) - failed
            return answers

        return execute_recorded

    @contextlib.contextmanager
    def recording(self, commands: PassCommands) -> Iterator[None]:
        """The commands sent in this block go to ``commands``."""
        self._local.commands = commands
        try:
            yield
        finally:
            self._local.commands = None
