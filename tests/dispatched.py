"""A record of the aten ops torch dispatches, for tests that count what a piece of code runs."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpNames(TorchDispatchMode):
    """The names of the aten ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
