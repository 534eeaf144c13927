"""What the per-model checks share: a problem's path, the list they add problems to, and
how they name a profile and write a number.
"""

from __future__ import annotations

from catalog.problems import PathPart, Problem
from catalog.spec import Profile

Path = tuple[PathPart, ...]


class Found(list[Problem]):
    """The problems found so far, in the order they were found."""

    def add(self, path: Path, code: str, message: str) -> None:
        """Record a problem with the field at path."""
        self.append(Problem(path=path, message=message, code=code))


def profile_label(p: Profile, i: int) -> str:
    return f'profile "{p.name}"' if p.name else f"profiles[{i}]"


def num(v: float) -> str:
    return f"{v:g}"


def not_finite(out: Found, path: Path, what: str, v: float) -> None:
    # NaN passes every comparison the reference makes, and no JSON can carry it.
    out.add(path, "not_finite", f"{what} is {v}: write a finite number")
