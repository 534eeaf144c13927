"""Where a node is reached: the address the control plane sees it at, never what it claims.

Plain functions, no database. A replica's endpoint (which the guard and the gateway call)
and a multi-node replica's leader are built from ``node_host``: the address an operator
allowed for the node if there is one, else the address the node's own requests came from
(``peer_address``). The inventory's ``hostname`` is only shown: an agent that could name
its endpoint could point the guard at a server of its own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def peer_address(remote: str, forwarded_for: str = "", trusted: Iterable[str] = ()) -> str:
    """Return the address a request came from.

    ``remote`` is the connection's peer. ``X-Forwarded-For`` (``forwarded_for``) is
    honoured only when the peer is one of ``trusted`` (the ``LLMGW_TRUSTED_PROXIES``
    setting): the address taken is the right-most one no trusted proxy added, since a
    client may put anything to the left.
    """
    trusted = {_canonical(t) for t in trusted}
    here = _canonical(remote)
    if here not in trusted or not forwarded_for:
        return here
    hops = [_canonical(h) for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if hop not in trusted:
            return hop
    return here


def _canonical(text: str) -> str:
    text = text.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text


def node_host(name: str, address: str, allowed_address: str) -> str:
    """Return the host a node's engines are reached at (the operator's, else the seen one).

    A node with neither (joined inside this process, as tests do) is reached at its name.
    """
    return allowed_address or address or name


def host_port(host: str, port: int | None) -> str:
    """Return ``host:port`` (an IPv6 address in brackets), or the host without a port."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}" if port else host


def check_allowed(text: str) -> str | None:
    """Return why ``text`` cannot be an address an operator allows for a node, or None.

    An IP address or a DNS name; empty clears it (the seen address is used again).
    """
    text = text.strip()
    if not text:
        return None
    try:
        ipaddress.ip_address(text.strip("[]"))
        return None
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if len(text) > 200 or not all(
        label
        and len(label) <= 63
        and label.replace("-", "").isalnum()
        and label.isascii()
        and not label.startswith("-")
        and not label.endswith("-")
        for label in labels
    ):
        return (
            f'"{text[:60]}" is not an IP address or host name: give the address the '
            "gateway reaches this node's engines at, like 10.0.0.7 or gpu-07.internal"
        )
    return None
