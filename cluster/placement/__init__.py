"""Placement: which nodes new replicas go on, as a function of plain data.

Architecture step 3. The reconciler hands ``place`` the nodes as they reported themselves,
the facility domains with power caps, the replicas already running and the replicas it
wants; ``place`` returns a ``Plan``: where each new replica goes, which running replicas
make way for it, and, for each that fits nowhere, why, in words an operator reads. No
Django and no I/O: the same input gives the same plan, and nothing passed in is changed.

How a request is placed:

1. Requests go in order of class (critical, standard, opportunistic), then their own
   ``priority`` (higher first), then key. Running replicas hold what they use throughout.
2. A request's profiles are tried by priority, highest first, ties in declaration order;
   the first that fits wins.
3. A node fits a profile when it is schedulable; runs the engine (a version starting with
   ``engine_version``, read by whole components: "0.1" takes 0.1.3, not 0.11.0); carries
   every ``node_selector`` label; has ``gpus_per_node`` free cards of exactly
   ``gpu_class``; has the memory (``min_memory_gb`` per node), the CPU cores
   (``cpu_cores`` per node) and, unless it holds the weights already, the disk
   (``min_disk_gb``); and every capped domain it is in (its ``llmgw.io/<level>`` labels)
   stays within its cap. A node that reports 0 memory, cores or disk is not excluded:
   unknown is not full.
4. A multi-node profile needs ``nodes`` distinct such nodes, all sharing one rack, row,
   room or site when ``keep_within`` says so (nodes without that label are passed over);
   their power is counted together. ``keep_within`` constrains multi-node profiles only:
   one node is always within one rack.
5. Among the nodes that fit, a one-node replica goes where its model has the fewest
   replicas (spread, as Kubernetes spreads a deployment's pods): on the node, then in
   its ``llmgw.io/rack``; where it must share, the placement's
   ``note`` says so. Then those holding the weights come first, then the best fit
   (the fewest free cards of the class that suffice, so large holes stay for large
   models; for a CPU profile, nodes without cards and then the fewest free cores), then
   the name.
6. Only when a request fits nowhere may it evict running replicas of a strictly lower
   class, on one node (or one set of nodes for a multi-node profile): the lowest classes
   and the fewest replicas that make room. An evicted replica is not placed again in
   the same plan; the reconciler asks for it again, and it comes back when room returns.

Cards: an index names a card or MIG instance on its node (unique per node, as the
inventory reports them). A MIG instance is its own class. A card with MIG instances
carved out of it (another card's ``mig_of``) is never offered whole, and a replica that
holds such a card whole (from before it was carved) holds its instances too.

Power: a replica draws its profile's ``power_watts``, split evenly over its nodes; when
that is 0 it is derived per node, each card at the power limit it reports plus each
reserved core at ``cpu_core_watts``. A domain with a cap of 0 or less is uncapped.

Disk: the weights are fetched once per node. Each replica on a node that does not hold
its source records the ``min_disk_gb`` it needs (``Assignment.disk_mb``); the node
reserves the largest of these once per source, while any of those replicas remains.

Where the parts are:

- ``data``: the inputs and outputs (``Node``, ``Running``, ``Request``, ``Plan``...), and
  a catalog model's profiles and requests in placement's view;
- ``placing``: ``place``, the entry point, and one request placed (rules 1 and 2);
- ``state``: ``State``, the cluster as it stands while a plan is made (what is free on each
  node, what each running replica holds), and whether one node fits (rule 3);
- ``finding``: the best node or set of nodes for a replica (rules 4 and 5);
- ``evicting``: making room by evicting lower classes (rule 6);
- ``reasons``: why a request fits nowhere, in an operator's words, and whether it never could;
- ``sparing``: ``place_sparing``, placing so that a patient request darkens no model.
"""

from __future__ import annotations

from cluster.placement.data import (
    CLASS_NAMES,
    DEFAULT_CPU_CORE_WATTS,
    LABEL_PREFIX,
    RACK_LABEL,
    UNPLACEABLE,
    Assignment,
    Card,
    Domain,
    Eviction,
    Node,
    Placement,
    PlacementProfile,
    Plan,
    Request,
    Running,
    Unplaced,
    class_name,
    profiles_from_spec,
    requests_from_spec,
    unplaceable,
)
from cluster.placement.placing import place
from cluster.placement.sparing import Held, place_sparing

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_CPU_CORE_WATTS",
    "LABEL_PREFIX",
    "RACK_LABEL",
    "UNPLACEABLE",
    "Assignment",
    "Card",
    "Domain",
    "Eviction",
    "Held",
    "Node",
    "Placement",
    "PlacementProfile",
    "Plan",
    "Request",
    "Running",
    "Unplaced",
    "class_name",
    "place",
    "place_sparing",
    "profiles_from_spec",
    "requests_from_spec",
    "unplaceable",
]
