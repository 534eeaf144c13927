"""What the rules know of the installation they check a catalog for, passed in, never read.

The rules are plain Python (no Django, no settings): a fact of the installation a rule
needs arrives as an ``Environment``, which ``catalog.services.environment()`` builds from
the settings for every surface (forms, admin, API, file import and validate). Without
one, the rules take the strictest reading: no key file, and no plain ``http://``.

- ``secrets_dir`` (``LLMGW_SECRETS_DIR``): the one folder an external provider's
  ``api_key_file`` may name a file in. The gateway reads that file (as the user it runs
  as) and sends it to the provider's ``url``: any path would let whoever edits the
  catalog send any file the gateway can read to any address.
- ``http_hosts`` (``LLMGW_EXTERNAL_HTTP_HOSTS``): the ``host:port`` pairs an external
  ``url`` may reach over plain ``http://`` (a provider inside the site's network, a model
  server on this machine); a host written alone is its port 80. Nothing else, loopback
  included: a loopback port may be Redis or the database, which a provider ``url`` would
  let whoever edits the catalog send requests to. Every other provider is ``https://``.

``key_file`` and ``url_problem`` are the checks themselves, used by the rules and again
by the gateway when it reads a key file or sends to a provider.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

SECRETS_SETTING = "LLMGW_SECRETS_DIR"
HTTP_HOSTS_SETTING = "LLMGW_EXTERNAL_HTTP_HOSTS"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Environment:
    """The installation's facts the rules depend on (see the module's docstring)."""

    secrets_dir: str = ""
    http_hosts: frozenset[str] = frozenset()


STRICT = Environment()


def key_file(path: str, secrets_dir: str) -> tuple[str, str]:
    """Return (the file's absolute path, "") for a key file the rules allow, else ("", why).

    ``path`` is a file's name in the secrets folder (``openai``, ``team/openai``) or an
    absolute path inside it; never one with a ``..`` part. Where a symbolic link leads is
    the reader's to check (``gateway.path.app``): the rules touch no file.
    """
    if not secrets_dir:
        return "", (
            f"no key file is allowed: no secrets folder is set ({SECRETS_SETTING}); the "
            "operator sets it to the folder holding the providers' keys, then name a file "
            "in it, or leave api_key_file empty"
        )
    if _CONTROL.search(path):
        return "", "contains a control character: name a file in the secrets folder"
    if ".." in path.split("/"):
        return "", f'has a ".." part: name a file in the secrets folder ({secrets_dir})'
    root = posixpath.normpath(secrets_dir)
    full = posixpath.normpath(posixpath.join(root, path))
    if not full.startswith(root.rstrip("/") + "/"):
        return "", (
            f"is outside the secrets folder {root} ({SECRETS_SETTING}): put the key file "
            "there and name it by its name in that folder"
        )
    return full, ""


def is_loopback(host: str) -> bool:
    """Whether a URL's host is this machine: localhost, 127.0.0.0/8 or ::1."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_port(entry: str) -> str:
    """Return an ``http_hosts`` entry as ``host:port`` (lower case; port 80 when not
    written; an IPv6 address in brackets), or "" for one that is not a host."""
    try:
        parts = urlsplit("http://" + entry.strip())
        host, port = parts.hostname or "", parts.port or 80
    except ValueError:
        return ""
    if not host or parts.path or parts.query or parts.username or _CONTROL.search(entry):
        return ""
    host = host.rstrip(".")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_problem(url: str, http_hosts: frozenset[str] = frozenset()) -> str:
    """Why an external provider's ``url`` may not be sent to, or "" (a well-formed http(s)
    address is assumed: ``model_checks`` says when it is not)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        port = parts.port or 80
    except ValueError:
        return ""
    if parts.scheme.lower() != "http":
        return ""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if where in {host_port(h) for h in http_hosts}:
        return ""
    return (
        f"is plain http:// to {where}: the prompts and the provider's key would cross the "
        f"network unencrypted, and a port here may be another service's; use https://, or "
        f"have the operator list {where} in {HTTP_HOSTS_SETTING}"
    )
