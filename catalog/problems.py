"""What a refused catalog change says: where, what, and a stable code.

Every surface (the file commands, the API, the admin, the console, ``Model.clean``) reports
the same ``Problem`` for the same bad input: the field path names what to change, the
message says what is wrong and what to do, and the code is stable for tests and scripts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PathPart = str | int


@dataclass(frozen=True)
class Problem:
    """One reason a catalog (or a model in it) is refused.

    ``path`` is relative to the model (``("profiles", 0, "tp")``); ``index`` is the model's
    position in the catalog or file being checked, when there is one; ``model`` its name.
    """

    path: tuple[PathPart, ...]
    message: str
    code: str
    model: str = ""
    index: int | None = None

    @property
    def field(self) -> str:
        """Return the path as written in messages: ``profiles[0].tp``."""
        return format_path(self.path)

    @property
    def file_path(self) -> str:
        """Return the path from the top of a file: ``models[3].profiles[0].tp``."""
        if self.index is None:
            return self.field
        return format_path(("models", self.index, *self.path))

    def line(self) -> str:
        """Return the one line ``catalog validate`` prints for this problem."""
        where = self.file_path or "(file)"
        who = f' (model "{self.model}")' if self.model else ""
        return f"{where}{who}: {self.message}"


def format_path(path: Sequence[PathPart]) -> str:
    """Return ``a.b[2].c`` for ``("a", "b", 2, "c")``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out
