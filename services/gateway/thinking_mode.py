"""How a chat request asks for thinking mode: vLLM's ``chat_template_kwargs``, DeepSeek's
``thinking`` switch, OpenAI's ``reasoning_effort`` (``ChatPrompt.thinking`` weighs them)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from .schemas import _Body

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # OpenAI's, and V4's max
EFFORTS = {"high": "high", "xhigh": "max", "max": "max"}  # OpenAI's lower levels: V4's default (low)


class ChatTemplateKwargs(_Body):
    """vLLM's convention for choosing thinking mode per request."""

    model_config = ConfigDict(extra="forbid")
    thinking: bool | None = None
    reasoning_effort: Literal["low", "high", "max"] | None = None


class ThinkingSwitch(_Body):
    """DeepSeek's API convention (its OpenAI format) for thinking mode on or off."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "disabled"]
