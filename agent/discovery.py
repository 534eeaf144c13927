"""What the agent finds on its node: the GPU classes it reports. No Django here.

A GPU class names a kind of card as the agent reports it: lowercase vendor, model and
memory, like ``nvidia-h100-80gb``. A MIG instance is its card's class, ``-mig-`` and the
MIG profile: ``nvidia-a100-80gb-mig-1g.10gb``.
"""

from __future__ import annotations


def is_mig_class(gpu_class: str) -> bool:
    """Return whether a GPU class names a MIG instance rather than a whole card."""
    return "-mig-" in gpu_class.lower()
