"""Triton's interpreter (``TRITON_INTERPRET=1``, the CPU runs of the kernels) patches
``triton.language`` once per launch, then again on every call of a device function inside it: each
``tl.sum``, ``tl.max``, ``tl.sigmoid`` of every program rescans the language modules
(``inspect.getmembers``, ~2-3 ms idle). The hyper-connection mix's Sinkhorn makes ~45 such calls a
program: 60% of its time in a profile, ~120 ms a program where the rest of the kernel is ~30.

Inside one launch nothing restores a patch until the launch ends, so a device function's second call
rescans modules already patched and changes nothing; ``install`` makes it patch once per module a
launch (a device function's globals: its module), the first time as before. The kernels' arithmetic
is untouched: the same numbers, bit for bit.
"""

from __future__ import annotations

from triton.runtime import interpreter

_patched_in_launch: set[int] | None = None  # id(globals) of the modules patched in the running launch


def install() -> None:
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def patch_lang_once(fn):
        module = id(fn.__globals__)
        if _patched_in_launch is None:
            return patch_lang(fn)
        if module in _patched_in_launch:  # only device functions get here: the launch's own patch came first
            return None
        _patched_in_launch.add(module)
        return patch_lang(fn)

    def launch_patching_once(self, *args, **kwargs):
        global _patched_in_launch
        outer, _patched_in_launch = _patched_in_launch, set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _patched_in_launch = outer

    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch_patching_once
