"""An external provider's key, read as the gateway sends a request to it, and checked again.

The catalog's rules refuse an ``external.api_key_file`` outside the secrets folder
(``LLMGW_SECRETS_DIR``) and a plain ``http://`` provider that is not loopback or listed
(``LLMGW_EXTERNAL_HTTP_HOSTS``) on every surface (``catalog.rules.environment``). The
gateway asks the same again at the moment it would send, since a row may predate the rule
or the folder may have changed, and adds what only a reader can see:

- the file, its symbolic links followed, is still inside the secrets folder;
- it is a regular file, opened without blocking: a FIFO, a device or a socket named
  there is refused before anything is read from it (a FIFO would hold the reader, and
  the event loop of every request with it, until something wrote to it);
- it holds one key: at most ``MAX_BYTES``, one line (a trailing line break is dropped)
  of visible ASCII characters. A file of several lines would put its other lines into
  the request as headers of their own; any other text is not a key.

A refusal sends nothing to the provider: the hop fails (``ProviderRefused``) and the request
moves on to what else may answer it; the gateway's log says why, naming the model and
the file, never its content. A key is read again when its file's modification time or
size changes.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from typing import Any

from django.conf import settings

from catalog.rules import environment
from llmgw_core.refused import Refused

log = logging.getLogger("gateway")

MAX_BYTES = 4096
_KEY = re.compile(r"[\x21-\x7e]+")

# By the file's real path: (modification time, size) -> the key, or why it is refused.
_held: dict[str, tuple[tuple[float, int], str, str]] = {}


class ProviderRefused(Refused):
    """A provider not asked: its url or key file is not allowed; ``why`` for the log."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(why)
        self.model = model
        self.why = why

    @property
    def told(self) -> str:
        """What the client's error says: the model, never the path or the reason."""
        return f"the provider of {self.model} was not asked (its key file or url is refused)"


def key(model: Any) -> str:
    """The key to send ``model``'s provider ("" when it names no key file); ``ProviderRefused``
    when the provider must not be asked."""
    ext = model.external
    why = environment.url_problem(ext.url, frozenset(settings.LLMGW_EXTERNAL_HTTP_HOSTS))
    if why:
        raise ProviderRefused(model.name, f"external url {ext.url!r} {why}")
    if not ext.api_key_file:
        return ""
    secrets_dir = settings.LLMGW_SECRETS_DIR
    full, why = environment.key_file(ext.api_key_file, secrets_dir)
    if why:
        raise ProviderRefused(model.name, f"api_key_file {ext.api_key_file!r} {why}")
    real = os.path.realpath(full)
    root = os.path.realpath(secrets_dir)
    if not real.startswith(root.rstrip("/") + "/"):
        raise ProviderRefused(model.name, f"api_key_file {full} leads outside the secrets folder {root} "
                      f"(to {real}): put the key itself in the folder")  # fmt: skip
    try:
        st = os.stat(real)
    except OSError as error:
        raise ProviderRefused(
            model.name, f"api_key_file {full} cannot be read: {error.strerror}"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ProviderRefused(model.name, f"api_key_file {full} {_not_regular(st.st_mode)}")
    stamp = (st.st_mtime, st.st_size)
    held = _held.get(real)
    if held is None or held[0] != stamp:
        secret, why = _read(real)
        held = (stamp, secret, why)
        _held[real] = held
    if held[2]:
        raise ProviderRefused(model.name, f"api_key_file {full} {held[2]}")
    return held[1]


def _read(path: str) -> tuple[str, str]:
    """(the key, "") or ("", why the file is not one)."""
    try:
        # Never blocking: a FIFO put there after the check above opens at once and is
        # refused by what fstat says of the file opened, before a byte is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        return "", f"cannot be read: {error.strerror}"
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return "", _not_regular(mode)
        raw = os.read(fd, MAX_BYTES + 1)
    except OSError as error:
        return "", f"cannot be read: {error.strerror}"
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        return "", f"is larger than {MAX_BYTES} bytes: a key file holds one key"
    text = raw.decode("latin-1")
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    text = text.strip(" ")
    if not text:
        return "", "is empty: write the provider's key in it"
    if not _KEY.fullmatch(text):
        return "", (
            "is not one line of visible ASCII characters (it holds a line break, a control "
            "character, a space or other text): a key file holds the key alone, on one line"
        )
    return text, ""


def _not_regular(mode: int) -> str:
    """Why a key file that is not a regular file is refused, naming what it is."""
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))  # fmt: skip
    what = next((name for test, name in kinds if test(mode)), "not a regular file")
    return (
        f"is {what}, not a regular file: it is not read (it could block); write the key in "
        "a plain file in the secrets folder"
    )
