"""The exact prompt a judge receives: what ``guard prompt`` prints and a judge's page shows."""

from __future__ import annotations

from guard import formats, known, snapshots

# Between ShieldGemma's prompts (one per policy sentence): a line holding a form feed.
SEPARATOR = "\n\f\n"


def judge_prompt(name: str, request: str, answer: str | None = None) -> str:
    """Return the prompt(s) a judge is sent for a request, or for an answer to it.

    The judge's format, categories and variant are the catalog's when it is a guard
    model there, else the known judge's. The text is the prompt exactly as sent for a
    raw completion (the BOS text the server adds itself left out); ShieldGemma's one
    prompt per policy sentence are joined by ``SEPARATOR``.

    Raises:
        ValueError: the name is neither a guard model in the catalog nor a known judge.
    """
    (judge,) = snapshots.judges([name])
    fmt = judge.format or (known.KNOWN[name].format if name in known.KNOWN else None)
    if fmt is None:
        raise ValueError(f'"{name}" is neither a guard model in the catalog nor a known judge')
    found = formats.get(fmt)
    prompts = found.prompts(
        request,
        answer,
        categories=judge.categories or None,
        variant=judge.variant,
        for_raw_completion=found.raw_completion,
    )
    return SEPARATOR.join(p.text for p in prompts)
