"""DeepSeek-V4's special tokens as the released tokenizer spells them.

The bars are full-width (U+FF5C) and the spaces inside names are U+2581, never ASCII
look-alikes: a prompt built with ``<|User|>`` tokenizes into plain text on the real model.
"""

from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
END_THINK = "</think>"
LATEST_REMINDER = "<｜latest_reminder｜>"
IMAGE = "<｜deepseek_image｜>"
DSML = "｜DSML｜"

# the order the demo tokenizer gives them ids 0, 1, 2, ... (BOS 0 and EOS 1 as in the release)
SPECIAL_TOKENS = (BOS, EOS, PAD, USER, ASSISTANT, THINK, END_THINK, LATEST_REMINDER, IMAGE, DSML)

# special tokens of the answer's own structure (dayzero.chat.output parses them): kept in decoded
# text, where every other special token is left out
OUTPUT_MARKERS = (THINK, END_THINK, DSML)
