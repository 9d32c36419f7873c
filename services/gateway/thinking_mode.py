"""How a chat request asks for thinking mode: vLLM's ``chat_template_kwargs``, DeepSeek's
``thinking`` switch, OpenAI's ``reasoning_effort`` (``ChatPrompt.thinking`` weighs them).

Precedence (DeepSeek's API: the switch turns thinking on or off, the effort sets how hard it
thinks): ``thinking`` or ``chat_template_kwargs.thinking`` decides the mode, and an effort beside
a switch that turned thinking off goes unused. Asking two ways at once for different things is a
400 naming both (``thinking_conflict``): the two switches apart, ``reasoning_effort: "none"``
(OpenAI's thinking off) beside a switch turning it on, or two efforts V4 reads as different levels.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from .body_model import _Body

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]  # OpenAI's, DeepSeek's
# DeepSeek's API table (api-docs.deepseek.com, guides/thinking_mode): each effort -> the level V4 reads
EFFORTS = {
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "high",
    "max": "max",
    "ultra": "max",
}


def v4_effort(effort: Effort | None) -> str:
    """The level (low | high | max) V4's encoding gets for a request's ``reasoning_effort``: low,
    the encoding's default (no paragraph), for none."""
    return EFFORTS.get(effort or "", "low")


class ChatTemplateKwargs(_Body):
    """vLLM's convention for choosing thinking mode per request."""

    model_config = ConfigDict(extra="forbid")
    thinking: bool | None = None
    reasoning_effort: Literal["low", "high", "max"] | None = None


class ThinkingSwitch(_Body):
    """DeepSeek's API convention (its OpenAI format) for thinking mode on or off."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "disabled"]


def thinking_conflict(
    kwargs: ChatTemplateKwargs, switch: ThinkingSwitch | None, effort: Effort | None
) -> tuple[tuple[str, ...], str, object] | None:
    """(the field to blame, why, its value) for the first two fields asking for different things."""
    asked, turned_on = kwargs.thinking, None if switch is None else switch.type == "enabled"
    if turned_on is not None and asked is not None and asked != turned_on:
        message = f"thinking {switch.type!r} contradicts chat_template_kwargs.thinking {str(asked).lower()}"
        return ("thinking", "type"), message, switch.type
    if effort == "none" and (turned_on or asked):
        other = "thinking 'enabled'" if turned_on else "chat_template_kwargs.thinking true"
        return ("reasoning_effort",), f"reasoning_effort 'none' (thinking off) contradicts {other}", effort
    level = v4_effort(effort)
    if kwargs.reasoning_effort and effort not in (None, "none") and level != kwargs.reasoning_effort:
        message = (
            f"reasoning_effort {effort!r} (V4's {level!r}) contradicts"
            f" chat_template_kwargs.reasoning_effort {kwargs.reasoning_effort!r}"
        )
        return ("reasoning_effort",), message, effort
    return None
