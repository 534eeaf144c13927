"""What a replica's reason tells whom: viewers see what failed, operators also why in detail.

An agent's reason may carry, after ``agent.weights.DETAIL``, what only operators are shown:
the path it refused, the host it would not fetch from, what an origin answered. A viewer
shown those could use the catalog to learn which files a node has and which ports answer
it. A replica's own reason (the console's, the judge page's, the API's) is only ever the
part before; a replica's assignments give operators the whole.
"""

from __future__ import annotations

from agent.weights import DETAIL


def public(reason: str) -> str:
    """Return the part of a reason anyone who can see the replica is shown."""
    return reason.split(DETAIL, 1)[0]


def for_role(reason: str, operator: bool) -> str:
    """Return a reason as shown to an operator (whole) or to a viewer (``public``)."""
    return reason if operator else public(reason)
