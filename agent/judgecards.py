"""The judge models' category tables, as their chat templates and model cards write them
(guard-formats.md §1.6, §2.2): one table, read both by the guard's formats (which build
the judges' prompts and read their answers) and by the sim judge (which stands in for
those models and must read the same prompts). It lives here, in the lowest layer, so
that both can import it. No Django here.
"""

from __future__ import annotations

# Qwen3Guard's answer category names (§1.6): the template lists each with a period;
# Jailbreak is for requests only, and is last.
QWEN3GUARD_CATEGORIES = (
    "Violent",
    "Non-violent Illegal Acts",
    "Sexual Content or Sexual Acts",
    "PII",
    "Suicide & Self-Harm",
    "Unethical Acts",
    "Politically Sensitive Topics",
    "Copyright Violation",
    "Jailbreak",
)
QWEN3GUARD_ANSWER_CATEGORIES = QWEN3GUARD_CATEGORIES[:-1]

# Llama Guard 3: code, the chat template's string (without its period) and the model
# card's name (§2.2).
LLAMA_GUARD_CATEGORIES = (
    ("S1", "Violent Crimes", "Violent Crimes"),
    ("S2", "Non-Violent Crimes", "Non-Violent Crimes"),
    ("S3", "Sex Crimes", "Sex-Related Crimes"),
    ("S4", "Child Exploitation", "Child Sexual Exploitation"),
    ("S5", "Defamation", "Defamation"),
    ("S6", "Specialized Advice", "Specialized Advice"),
    ("S7", "Privacy", "Privacy"),
    ("S8", "Intellectual Property", "Intellectual Property"),
    ("S9", "Indiscriminate Weapons", "Indiscriminate Weapons"),
    ("S10", "Hate", "Hate"),
    ("S11", "Self-Harm", "Suicide & Self-Harm"),
    ("S12", "Sexual Content", "Sexual Content"),
    ("S13", "Elections", "Elections"),
    ("S14", "Code Interpreter Abuse", "Code Interpreter Abuse"),
)
