"""``guard.policy.complete``: a policy's categories hold for every judge it lists.

The rule every surface applies before saving (``guard.services.prepare_policy``), over
judge sets and category sets drawn by hypothesis: a judge's unsafe verdict in a category
the policy refuses under another judge's name is refused; nothing asked for is lost
without a word; the result is its own completion.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from guard import formats
from guard.formats import LLAMA_GUARD_CATEGORIES, QWEN3GUARD_CATEGORIES, UNSAFE, Verdict
from guard.known import KNOWN
from guard.policy import BASELINE, REFUSE, Policy, complete, decide, equivalents

LLAMA = tuple(card for _, _, card in LLAMA_GUARD_CATEGORIES)
NAMES = (*QWEN3GUARD_CATEGORIES, *LLAMA[:-1])  # "Suicide & Self-Harm" is in both
# Names no judge here reports, so a policy listing one is refused (or it is dropped).
STRANGERS = ("Gambling", "Spam")


def _cased(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from((name, name.lower(), name.upper()))


# A pool of judges: the known ones, and json judges of made-up names reporting any subset
# of both taxonomies' names (a json judge reports what it is configured with).
judge_pools = st.dictionaries(
    st.sampled_from(("json-a", "json-b", "json-c")),
    st.lists(st.sampled_from(NAMES), unique=True, max_size=8).map(tuple),
    max_size=3,
).map(lambda extra: {**{n: kj.categories for n, kj in KNOWN.items()}, **extra})


@st.composite
def cases(draw: st.DrawFn) -> tuple[Policy, dict[str, tuple[str, ...]]]:
    pool = draw(judge_pools)
    judges = draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=4, unique=True))
    picked = draw(
        st.lists(st.sampled_from((*NAMES, *STRANGERS)), unique_by=str.casefold, max_size=10)
    )
    categories = tuple(draw(_cased(c)) for c in picked)
    policy = Policy(judge_models=tuple(judges), refuse_categories=categories)
    return policy, pool


def _reportable(policy: Policy, pool: dict[str, tuple[str, ...]]) -> set[str]:
    return {c.casefold() for j in policy.judge_models for c in pool[j]}


@settings(max_examples=300, deadline=None)
@given(cases())
def test_no_listed_judge_names_a_refused_harm_that_is_allowed(
    case: tuple[Policy, dict[str, tuple[str, ...]]],
) -> None:
    policy, pool = case
    done, changes, problems = complete(policy, pool)
    reportable = _reportable(policy, pool)
    if problems:
        # Refused only for a category no listed judge reports, nor an equivalent of it.
        assert done is None
        for p in problems:
            assert p.code == "unreported_category" and p.path[0] == "categories"
            category = policy.refuse_categories[p.path[1]]  # type: ignore[index]
            assert category.casefold() not in reportable
            assert not any(e.casefold() in reportable for e in equivalents(category))
            assert f'"{category}"' in p.message
        return
    assert done is not None
    assert (done.judge_models, done.fail, done.directions) == (
        policy.judge_models, policy.fail, policy.directions,
    )  # fmt: skip
    refused = {c.casefold() for c in done.refuse_categories}
    # Every refused category is one a listed judge can report.
    assert refused <= reportable
    # Each listed judge's unsafe verdict in an equivalent of a refused category refuses,
    # whichever judge's name the policy used for it.
    for judge in done.judge_models:
        for name in pool[judge]:
            if any(e.casefold() in refused for e in equivalents(name)):
                assert decide(done, Verdict(UNSAFE, (name,))) == REFUSE, (judge, name)
    # Nothing asked for is lost without a word: kept, or replaced and said.
    said = {c.category.casefold(): c for c in changes if not c.added}
    for category in policy.refuse_categories:
        if category.casefold() in reportable:
            assert category.casefold() in refused
        else:
            by = said[category.casefold()].by
            assert by and {c.casefold() for c in by} <= refused
    # What was added is said too.
    original = {c.casefold() for c in policy.refuse_categories}
    added = {c.casefold() for change in changes for c in change.by}
    assert refused - original <= added
    # The result is its own completion: saving it again changes nothing.
    assert complete(done, pool) == (done, [], [])


@settings(max_examples=200, deadline=None)
@given(cases())
def test_dropping_what_no_judge_reports_never_refuses(
    case: tuple[Policy, dict[str, tuple[str, ...]]],
) -> None:
    """``guard judge use``'s way: a category no listed judge can report is removed, said."""
    policy, pool = case
    done, changes, problems = complete(policy, pool, drop_unreportable=True)
    assert not problems and done is not None
    assert {c.casefold() for c in done.refuse_categories} <= _reportable(policy, pool)
    removed = {c.category for c in changes if not c.by}
    for category in policy.refuse_categories:
        if category in removed:
            assert category.casefold() not in _reportable(policy, pool)
    assert complete(done, pool) == (done, [], [])


def test_a_judge_no_pool_has_is_refused_at_its_place() -> None:
    pool = {n: kj.categories for n, kj in KNOWN.items()}
    policy = Policy(judge_models=("qwen3guard-0.6b", "not-a-judge"), refuse_categories=())
    done, _, problems = complete(policy, pool)
    assert done is None
    assert [(p.path, p.code) for p in problems] == [(("judge", "models", 1), "unknown_judge")]
    assert problems[0].message.startswith(
        'judge.models[1] "not-a-judge" is neither a guard model in the catalog nor a known judge'
    )


def test_the_issue_chain_refuses_llama_guards_violent_crimes() -> None:
    """The issue: Qwen3Guard's names only, Llama Guard added: its "Violent Crimes" allowed."""
    pool = {n: kj.categories for n, kj in KNOWN.items()}
    chain = Policy(
        judge_models=("qwen3guard-0.6b", "llamaguard3-1b"),
        refuse_categories=BASELINE.refuse_categories,
    )
    llama_says = Verdict(UNSAFE, ("Violent Crimes",))
    assert decide(chain, llama_says) != REFUSE  # as it was saved before
    done, changes, _ = complete(chain, pool)
    assert done is not None and decide(done, llama_says) == REFUSE
    assert changes[0].line() == (
        'added "Violent Crimes", "Indiscriminate Weapons": another listed judge\'s names for '
        '"Violent", so that judge refuses it too'
    )


def test_what_each_format_reports() -> None:
    assert formats.reported_categories("qwen3guard", ["Foo"]) == QWEN3GUARD_CATEGORIES
    assert formats.reported_categories("llamaguard3", None, "1b") == LLAMA[:13]
    assert formats.reported_categories("llamaguard3") == LLAMA
    assert formats.reported_categories("llamaguard3", ["Mine"])[:2] == ("Mine", LLAMA[1])
    assert formats.reported_categories("json", ["A", "B"]) == ("A", "B")
    assert formats.reported_categories("shieldgemma")[0] == "Dangerous Content"
