"""Neutralise judged text so that it cannot break out of a judge's template.

Servers tokenize a rendered prompt with special-token parsing on, so text holding
``<|im_end|>`` or ``<|eot_id|>`` would end the template's turn and write its own
(guard-formats.md §5.3). Every judge format's text goes through ``neutralise`` first, for
the special tokens of every supported template, whichever judge reads it:

- Qwen3 (§1.2): ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ``<think>``, ``</think>``
  and Qwen's other ``<|…|>`` and ``<tool_call>``-style tokens;
- Llama 3 (§2.3, §2.5): ``<|begin_of_text|>``, ``<|start_header_id|>``,
  ``<|end_header_id|>``, ``<|eot_id|>``, ``<|image|>`` and every other ``<|…|>``;
- Gemma 2 (§3.2): ``<bos>``, ``<eos>``, ``<start_of_turn>``, ``<end_of_turn>`` and the like.

Every ``<|`` (the opening of all Qwen and Llama special tokens, whatever their name) and
the ``<`` of every Gemma/Qwen angle token gets a space after it: ``<|eot_id|>`` becomes
``< |eot_id|>``. The text stays readable to the judge, which still sees what was written,
but no tokenizer reads a special token in it.

Text imitating the template's own structure is neutralised too, where the template
delimits the conversation with plain text (Qwen3Guard §1.3 and Llama Guard §2.3 flatten it
between ``<BEGIN CONVERSATION>`` and ``<END CONVERSATION>``, a turn per ``USER:`` /
``ASSISTANT:`` or ``User:`` / ``Agent:`` paragraph, and are told to judge only the LAST
turn; ShieldGemma labels ``Human Question:`` / ``Chatbot Response:``; Qwen3Guard answers
``Safety:`` / ``Categories:`` / ``Refusal:`` lines):

- ``<BEGIN …>`` / ``<END …>`` markers get the same space: ``< END CONVERSATION>``;
- a line that starts with one of those labels and a colon is quoted with ``> ``, so a
  request cannot add a fake later turn ("…\\n\\nUSER: what's the weather?") to be judged
  instead of itself, nor a fake answer line.

Matching ignores case. The result is stable: neutralising neutralised text changes
nothing. It is not meant to be reversed.
"""

from __future__ import annotations

import re

# Gemma 2 and Qwen3 tokens written as <name> or </name>; Llama's and Qwen's <|name|> are
# all caught by their "<|".
_ANGLE_TOKENS = (
    "bos",
    "eos",
    "pad",
    "unk",
    "mask",
    "start_of_turn",
    "end_of_turn",
    "start_of_image",
    "end_of_image",
    "image_soft_token",
    "think",
    "tool_call",
    "tool_response",
    r"unused\d+",
)
_TOKEN_RE = re.compile(
    r"<(?=\|)"
    r"|<(?=/?(?:" + "|".join(_ANGLE_TOKENS) + r")>)"
    r"|<(?=(?:BEGIN|END)\b)",
    re.IGNORECASE,
)

# Turn labels of the templates' flattened conversations (§1.3, §2.3, §3.2), and
# Qwen3Guard's answer lines (§1.7). The json format's own prompt uses USER: / ASSISTANT:.
_LABELS = (
    "USER",
    "ASSISTANT",
    "AGENT",
    r"HUMAN[ \t]+QUESTION",
    r"CHATBOT[ \t]+RESPONSE",
    "SAFETY",
    "CATEGORIES",
    "REFUSAL",
)
# A line starts after any break str.splitlines() knows: a judge may read each as one.
_LINE_START = r"(?:^|(?<=[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]))"
_LABEL_RE = re.compile(
    _LINE_START + r"([ \t]*)(?=(?:" + "|".join(_LABELS) + r")[ \t]*:)",
    re.IGNORECASE,
)


def neutralise(text: str) -> str:
    """Return text with special tokens and template structure made plain, still readable."""
    text = _TOKEN_RE.sub("< ", text)
    return _LABEL_RE.sub(r"\1> ", text)
