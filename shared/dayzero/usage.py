"""A completion's token counts as OpenAI reports them (``usage``: a finished stream's last entry
carries them). The workers' completions count as they go (completion.py); a request that waited past
DAYZERO_TASK_TIME_LIMIT_S is counted from the tokens it streamed (time_limit.py), by the gateway
(reaper.py) and by a worker that claimed it (waiting.py) alike. Torch-free: the gateway imports it."""

from __future__ import annotations


def usage_counts(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None) -> dict:
    """``reasoning_tokens``: thinking mode's (OpenAI's ``completion_tokens_details``); None: not in it."""
    counts: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if reasoning_tokens is not None:
        counts["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return counts
