"""Placement as it was before its indexes and memos: the reference the equivalence test
(``tests/cluster/test_placement_equivalence.py``) holds ``cluster.placement`` to.

A copy of ``cluster.placement``'s state, finding, evicting, reasons and placing, with
the plain data (``cluster.placement.data``) shared. Removed once the new path has held.
"""
