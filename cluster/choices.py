"""Choices of the cluster's fields."""

from __future__ import annotations

from django.db import models


class NodeHealth(models.TextChoices):
    """Whether a node's agent is heard from."""

    READY = "ready", "ready"
    NOT_READY = "not_ready", "not ready"
    LOST = "lost", "lost"


class ReplicaState(models.TextChoices):
    """A replica's life, as its agent reports it (pending until placed and started)."""

    PENDING = "pending", "pending"
    STARTING = "starting", "starting"
    LOADING = "loading", "loading"
    READY = "ready", "ready"
    FAILED = "failed", "failed"
    STOPPING = "stopping", "stopping"
    STOPPED = "stopped", "stopped"


class FacilityLevel(models.TextChoices):
    """The facility domains a power budget can cap."""

    RACK = "rack", "rack"
    ROW = "row", "row"
    ROOM = "room", "room"
    SITE = "site", "site"
