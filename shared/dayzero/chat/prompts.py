"""The fixed texts DeepSeek-V4 was trained with (its ``encoding/encoding_dsv4.py``): the tools
section and the response-format section of a system prompt, and the reasoning-effort paragraphs
that open a prompt in thinking mode. Reproduced character for character."""

from __future__ import annotations

from .tokens import DSML, END_THINK, THINK

_ABSOLUTE_MAXIMUM = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
_BEYOND_MAXIMUM = (
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, "
    "and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and "
    "are certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
)
# The paragraph per effort differs by checkpoint: DeepSeek-V4-Flash / -Pro as released (their
# encoding_dsv4.py: REASONING_EFFORT_MAX, only "max" adds a paragraph) and the 0731 / Vision-Exp
# revision (REASONING_EFFORT_PROMPTS: "high" takes the old "max" text, "max" a new one).
EFFORT_TABLES = {
    "v4": {"low": "", "high": "", "max": _ABSOLUTE_MAXIMUM},
    "0731": {"low": "", "high": _ABSOLUTE_MAXIMUM, "max": _BEYOND_MAXIMUM},
}
EFFORT_PARAGRAPHS = EFFORT_TABLES["0731"]  # "low" (the default) adds nothing


def effort_table_of(encoding_source: str | None) -> str | None:
    """Which effort table a checkpoint's own ``encoding/encoding_dsv4.py`` uses (None: no file, or
    one this code does not recognise)."""
    if encoding_source is None:
        return None
    if "REASONING_EFFORT_PROMPTS" in encoding_source:
        return "0731"
    if "REASONING_EFFORT_MAX" in encoding_source:
        return "v4"
    return None


RESPONSE_FORMAT_SECTION = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"

TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \
"<{DSML}tool_calls>" block like the following:

<{DSML}tool_calls>
<{DSML}invoke name="$TOOL_NAME">
<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>
...
</{DSML}invoke>
<{DSML}invoke name="$TOOL_NAME2">
...
</{DSML}invoke>
</{DSML}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, \
booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK}), you MUST output your complete reasoning inside \
{THINK}...{END_THINK} BEFORE any tool calls or final response.

Otherwise, output directly after {END_THINK} with tool calls or final response.

### Available Tool Schemas

{{schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""
