"""The cluster: nodes, cards, replicas, placement and the reconciler."""
