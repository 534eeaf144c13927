"""Choices the catalog's fields take, named as the catalog's files name them."""

from __future__ import annotations

from django.db import models


class CapacityClass(models.TextChoices):
    """How much a model's capacity is worth against another's."""

    DEFAULT = "", "(default)"
    CRITICAL = "critical", "critical"
    STANDARD = "standard", "standard"
    OPPORTUNISTIC = "opportunistic", "opportunistic"


class Engine(models.TextChoices):
    """The inference engines an agent can run."""

    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"
    LLAMACPP = "llamacpp", "llama.cpp"
    TRTLLM = "trtllm", "TensorRT-LLM"
    SIM = "sim", "sim (synthetic text)"


class Role(models.TextChoices):
    """What a model is for: serving clients, or judging traffic."""

    SERVE = "", "(serves clients)"
    GUARD = "guard", "guard"


class ChangeAction(models.TextChoices):
    """What a change-log entry did."""

    CREATE = "create", "created"
    UPDATE = "update", "changed"
    DELETE = "delete", "deleted"
    REVERT = "revert", "reverted"


class Surface(models.TextChoices):
    """Where a change came from."""

    CONSOLE = "console", "console"
    API = "api", "API"
    ADMIN = "admin", "admin"
    FILE = "file", "file import"
    CLI = "cli", "command line"
    GATEWAY = "gateway", "gateway"
    UPDATES = "updates", "updates"
