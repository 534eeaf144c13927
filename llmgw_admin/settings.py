"""Settings for every environment, read from ``LLMGW_*`` variables (docs/configuration.md).

Unset ``LLMGW_DATABASE_URL`` and ``LLMGW_REDIS_URL`` give the embedded default: SQLite in
the data folder, the in-memory channel layer and periodic work inside the web process.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from llmgw_admin.demo import parse_simulate
from llmgw_admin.jobs import beat_schedule
from llmgw_core.env import (
    database_from_url,
    envbool,
    envint,
    envlist,
    envstr,
    private_dir,
    private_file,
    secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(envstr("DATA_DIR", "var"))
if not DATA_DIR.is_absolute():
    DATA_DIR = BASE_DIR / DATA_DIR
# Private (700): it holds the secret key, the embedded database and node tokens.
private_dir(DATA_DIR)

SECRET_KEY = secret_key(DATA_DIR)
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
# Behind a TLS proxy that sets X-Forwarded-Proto (and drops any the client sent): a request
# it marks https is secure, so forms posted over https pass the CSRF origin check, and the
# session and CSRF cookies go over HTTPS only (docs/production.md).
TLS_PROXY = envbool("TLS_PROXY", False)
if TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    # Browsers that reached the site over HTTPS keep to HTTPS (Django's SecurityMiddleware
    # sends it on secure requests only); 0 sends none.
    SECURE_HSTS_SECONDS = envint("HSTS_SECONDS", 31536000)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "channels",
    "llmgw_core",
    "llmgw_admin",
    "catalog",
    "cluster",
    "guard",
    "gateway",
    "updates",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "llmgw_core.security.security_headers_middleware",
    # PostgreSQL away or hung: 503 with Retry-After, never a request held.
    "llmgw_admin.dbdown.DatabaseDownMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "llmgw_admin.throttle.login_throttle_middleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "llmgw_admin.urls"
ASGI_APPLICATION = "llmgw_admin.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "llmgw_core.roles.role_context",
                "llmgw_admin.context_processors.simulated",
            ],
        },
    },
]

DATABASE_URL = envstr("DATABASE_URL")
# PostgreSQL's bounds (llmgw_core/env.py database_from_url): a connection in seconds (the
# pool's wait for one too), a statement in seconds, and the connections a process holds.
LLMGW_DB_CONNECT_TIMEOUT = envint("DB_CONNECT_TIMEOUT", 5)
LLMGW_DB_STATEMENT_TIMEOUT = envint("DB_STATEMENT_TIMEOUT", 30)
LLMGW_DB_POOL_SIZE = envint("DB_POOL_SIZE", 10)
for _name in ("DB_CONNECT_TIMEOUT", "DB_STATEMENT_TIMEOUT"):
    if globals()[f"LLMGW_{_name}"] < 1:
        raise ImproperlyConfigured(
            f"LLMGW_{_name} is {globals()[f'LLMGW_{_name}']}: write 1 or more seconds"
        )
if LLMGW_DB_POOL_SIZE < 2:
    raise ImproperlyConfigured(
        f"LLMGW_DB_POOL_SIZE is {LLMGW_DB_POOL_SIZE}: write 2 or more (the pool keeps 2 open)"
    )
if DATABASE_URL:
    DATABASES = {
        "default": database_from_url(
            DATABASE_URL,
            connect=LLMGW_DB_CONNECT_TIMEOUT,
            statement=LLMGW_DB_STATEMENT_TIMEOUT,
            pool_size=LLMGW_DB_POOL_SIZE,
        )
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            # Sessions and password hashes: readable by this user only (600).
            "NAME": private_file(DATA_DIR / "llmgw.sqlite3"),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = envstr("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Measured faster than RedisChannelLayer for fan-out (docs/development.md).
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "llmgw"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# How long a call to Redis that something waits on may take (milliseconds): a request's
# budget check (gateway/path/limits.py), a write's live push (cluster/events.py), the Celery
# task a write sends. Past it, budgets are counted per process and pushes are dropped.
LLMGW_REDIS_TIMEOUT_MS = envint("REDIS_TIMEOUT_MS", 250)
if LLMGW_REDIS_TIMEOUT_MS < 1:
    raise ImproperlyConfigured(
        f"LLMGW_REDIS_TIMEOUT_MS is {LLMGW_REDIS_TIMEOUT_MS}: write 1 or more milliseconds"
    )
# How many live consoles (websockets) one user may hold open in one web process
# (llmgw_admin/consumer.py); the one over it is closed with 1008 and says why.
LLMGW_WS_PER_USER = envint("WS_PER_USER", 20)
if LLMGW_WS_PER_USER < 1:
    raise ImproperlyConfigured(f"LLMGW_WS_PER_USER is {LLMGW_WS_PER_USER}: write 1 or more")

# The cache holds the sign-in throttle's counts (llmgw_admin/throttle.py): in Redis, every
# web process counts the same failures; embedded, the one web process keeps them.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "llmgw",
            # A sign-in waits on it: bounded, and the throttle lets it through when it fails.
            "OPTIONS": {
                "socket_timeout": LLMGW_REDIS_TIMEOUT_MS / 1000,
                "socket_connect_timeout": LLMGW_REDIS_TIMEOUT_MS / 1000,
            },
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
# A write that sends a task (the reconciler woken) must not wait on a hung Redis: each
# broker command has the Redis timeout, at least 0.1 s (a worker's BRPOP is read once its
# answer is there, so its 1 s poll is unaffected).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_timeout": max(LLMGW_REDIS_TIMEOUT_MS / 1000, 0.1),
    "socket_connect_timeout": max(LLMGW_REDIS_TIMEOUT_MS / 1000, 0.1),
}
CELERY_BROKER_CONNECTION_TIMEOUT = max(LLMGW_REDIS_TIMEOUT_MS / 1000, 0.1)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = envint("TASK_TIME_LIMIT", 300)
CELERY_TIMEZONE = envstr("TIMEZONE", "UTC")

# The cluster (docs/configuration.md).
LLMGW_NODE_LOST_AFTER = envint("NODE_LOST_AFTER", 30)
LLMGW_IDLE_TIMEOUT = envint("IDLE_TIMEOUT", 900)
LLMGW_RECONCILE_INTERVAL = envint("RECONCILE_INTERVAL", 5)
# Load scaling (cluster/scaling.py): a model's load over what its replicas carry (or its
# TTFT p99 past its slo) held this many seconds scales it up; quiet this long, down by one.
LLMGW_SCALE_UP_AFTER = envint("SCALE_UP_AFTER", 30)
LLMGW_SCALE_DOWN_AFTER = envint("SCALE_DOWN_AFTER", 300)
# A serving replica the reconciler stops (scaled down, idle, a window closed) leaves every
# gateway's table first and its engine stops this many seconds later (its requests finish).
LLMGW_STOP_DRAIN = envint("STOP_DRAIN", 30)
LLMGW_LOCAL_AGENT = envbool("LOCAL_AGENT", True)
LLMGW_PROBE_INTERVAL = envint("PROBE_INTERVAL", 60)
# Federation (docs/federation.md): each peer's /v1/models read this often (each read
# waits at most FEDERATION_TIMEOUT seconds); its breaker trips after TRIP_ERRORS failed
# reads within TRIP_WINDOW seconds and comes back after RECOVER_PROBES passed in a row
# and at least DWELL seconds (LocalAI's figures).
LLMGW_FEDERATION_REFRESH = envint("FEDERATION_REFRESH", 10)
LLMGW_FEDERATION_TIMEOUT = envint("FEDERATION_TIMEOUT", 5)
LLMGW_FEDERATION_TRIP_ERRORS = envint("FEDERATION_TRIP_ERRORS", 1)
LLMGW_FEDERATION_TRIP_WINDOW = envint("FEDERATION_TRIP_WINDOW", 30)
LLMGW_FEDERATION_RECOVER_PROBES = envint("FEDERATION_RECOVER_PROBES", 3)
LLMGW_FEDERATION_DWELL = envint("FEDERATION_DWELL", 60)
for _name in ("REFRESH", "TIMEOUT", "TRIP_ERRORS", "TRIP_WINDOW", "RECOVER_PROBES"):
    if globals()[f"LLMGW_FEDERATION_{_name}"] < 1:
        raise ImproperlyConfigured(f"LLMGW_FEDERATION_{_name} must be 1 or more")
if LLMGW_FEDERATION_DWELL < 0:
    raise ImproperlyConfigured("LLMGW_FEDERATION_DWELL must be 0 or more (seconds)")
# The gateway's refusal records (gateway/records/refusals.py) are kept this many days; the job that
# deletes older ones runs every LLMGW_GATEWAY_REFUSAL_PRUNE_INTERVAL seconds.
LLMGW_GATEWAY_REFUSAL_DAYS = envint("GATEWAY_REFUSAL_DAYS", 30)
if LLMGW_GATEWAY_REFUSAL_DAYS < 1:
    raise ImproperlyConfigured(
        f"LLMGW_GATEWAY_REFUSAL_DAYS is {LLMGW_GATEWAY_REFUSAL_DAYS}: write 1 or more days"
    )
LLMGW_GATEWAY_REFUSAL_PRUNE_INTERVAL = envint("GATEWAY_REFUSAL_PRUNE_INTERVAL", 3600)
# Stored responses of the Responses API (gateway/stored.py: store, previous_response_id)
# are kept this many days; the job that deletes older ones runs every
# LLMGW_RESPONSES_PRUNE_INTERVAL seconds.
LLMGW_RESPONSES_KEEP = envint("RESPONSES_KEEP", 30)
if LLMGW_RESPONSES_KEEP < 1:
    raise ImproperlyConfigured(
        f"LLMGW_RESPONSES_KEEP is {LLMGW_RESPONSES_KEEP}: write 1 or more days"
    )
LLMGW_RESPONSES_PRUNE_INTERVAL = envint("RESPONSES_PRUNE_INTERVAL", 3600)
# The Files and Batch APIs (gateway/batch): files and batches kept under LLMGW_FILES_DIR (a
# folder every web and worker process reaches), an upload at most LLMGW_FILES_MAX_BYTES and
# LLMGW_FILES_MAX_LINES lines, kept LLMGW_FILES_KEEP days (the job that deletes older ones
# runs every LLMGW_FILES_PRUNE_INTERVAL seconds). The runner looks for batches to run every
# LLMGW_BATCH_INTERVAL seconds and sends LLMGW_BATCH_CONCURRENCY lines of a batch at once
# to the gateway (LLMGW_GATEWAY_URL), each given LLMGW_BATCH_LINE_TIMEOUT seconds.
LLMGW_FILES_DIR = Path(envstr("FILES_DIR") or DATA_DIR / "files")
if not LLMGW_FILES_DIR.is_absolute():
    LLMGW_FILES_DIR = BASE_DIR / LLMGW_FILES_DIR
LLMGW_FILES_MAX_BYTES = envint("FILES_MAX_BYTES", 100 * 1024 * 1024)
LLMGW_FILES_MAX_LINES = envint("FILES_MAX_LINES", 50000)
LLMGW_FILES_KEEP = envint("FILES_KEEP", 30)
for _name, _value in (("FILES_MAX_BYTES", LLMGW_FILES_MAX_BYTES),
                      ("FILES_MAX_LINES", LLMGW_FILES_MAX_LINES), ("FILES_KEEP", LLMGW_FILES_KEEP)):  # fmt: skip
    if _value < 1:
        raise ImproperlyConfigured(f"LLMGW_{_name} is {_value}: write 1 or more")
LLMGW_FILES_PRUNE_INTERVAL = envint("FILES_PRUNE_INTERVAL", 3600)
LLMGW_BATCH_INTERVAL = envint("BATCH_INTERVAL", 5)
LLMGW_BATCH_CONCURRENCY = envint("BATCH_CONCURRENCY", 4)
LLMGW_BATCH_LINE_TIMEOUT = envint("BATCH_LINE_TIMEOUT", 600)
if LLMGW_BATCH_INTERVAL < 1 or LLMGW_BATCH_CONCURRENCY < 1 or LLMGW_BATCH_LINE_TIMEOUT < 1:
    raise ImproperlyConfigured(
        "LLMGW_BATCH_INTERVAL, LLMGW_BATCH_CONCURRENCY and LLMGW_BATCH_LINE_TIMEOUT are "
        "each 1 or more"
    )
# Traffic over time (gateway.records.history): minutes kept this many hours, then summed into
# hours, kept this many days; the job that rolls them runs every this many seconds.
LLMGW_HISTORY_MINUTE_HOURS = envint("HISTORY_MINUTE_HOURS", 24)
LLMGW_HISTORY_HOUR_DAYS = envint("HISTORY_HOUR_DAYS", 30)
LLMGW_HISTORY_ROLL_INTERVAL = envint("HISTORY_ROLL_INTERVAL", 600)
if LLMGW_HISTORY_MINUTE_HOURS < 1 or LLMGW_HISTORY_HOUR_DAYS < 1 or LLMGW_HISTORY_ROLL_INTERVAL < 1:
    raise ImproperlyConfigured(
        "LLMGW_HISTORY_MINUTE_HOURS, LLMGW_HISTORY_HOUR_DAYS and LLMGW_HISTORY_ROLL_INTERVAL "
        "are 1 or more"
    )
# Updates (docs/updates.md): the weights mirror, a folder every web and worker process
# reaches (LLMGW_MIRROR=off: nodes fetch from the registry themselves, as before), its size
# cap in GB (0: none; a fetch past it is refused with the reason), the registry (the Hugging
# Face Hub's API at HF_ENDPOINT, its token read from LLMGW_HF_TOKEN_FILE), the hosts a plain
# http(s) source may name, and how often every model with an origin is checked for updates.
LLMGW_MIRROR = envbool("MIRROR", True)
LLMGW_MIRROR_DIR = Path(envstr("MIRROR_DIR") or DATA_DIR / "mirror")
if not LLMGW_MIRROR_DIR.is_absolute():
    LLMGW_MIRROR_DIR = BASE_DIR / LLMGW_MIRROR_DIR
try:
    LLMGW_MIRROR_MAX_GB = float(envstr("MIRROR_MAX_GB", "0") or 0)
except ValueError:
    raise ImproperlyConfigured(
        f"LLMGW_MIRROR_MAX_GB is {envstr('MIRROR_MAX_GB')!r}: write a number of GB, 0 for no cap"
    ) from None
if LLMGW_MIRROR_MAX_GB < 0:
    raise ImproperlyConfigured(
        f"LLMGW_MIRROR_MAX_GB is {LLMGW_MIRROR_MAX_GB}: write a number of GB, 0 for no cap"
    )
HF_ENDPOINT = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
LLMGW_HF_TOKEN_FILE = envstr("HF_TOKEN_FILE")
LLMGW_MIRROR_HOSTS = envlist("MIRROR_HOSTS", ["https://huggingface.co", HF_ENDPOINT])
LLMGW_UPDATE_CHECK_EVERY = envint("UPDATE_CHECK_EVERY", 86400)
if LLMGW_UPDATE_CHECK_EVERY < 60:
    raise ImproperlyConfigured(
        f"LLMGW_UPDATE_CHECK_EVERY is {LLMGW_UPDATE_CHECK_EVERY}: write 60 or more seconds"
    )
# An update's eval gate (docs/updates.md): an operator's own suites (name.yaml) beside the
# ones the project carries, and the gateway its cases are sent through, as a client's
# requests are (default: this machine's web process, on LLMGW_PORT).
LLMGW_EVAL_DIR = envstr("EVAL_DIR")
# Where the web process serves (``python3 run.py``, and ``manage.py serve`` without --bind or
# --port). run.py starts before Django can be imported and writes the same defaults
# (tests/test_settings_env.py holds them equal).
LLMGW_BIND = envstr("BIND", "127.0.0.1")
LLMGW_PORT = envint("PORT", 8000)
# Whether it was given: else ``manage.py serve`` makes it its own address.
GATEWAY_URL_GIVEN = bool(envstr("GATEWAY_URL"))
_GATEWAY_URL = envstr("GATEWAY_URL") or f"http://127.0.0.1:{LLMGW_PORT}"
LLMGW_GATEWAY_URL = _GATEWAY_URL.rstrip("/")
# Beat's schedule (style.md 2.6) from the one table of periodic jobs, which the embedded
# web process runs from too (llmgw_admin/jobs.py); each run expires before the next starts.
CELERY_BEAT_SCHEDULE = beat_schedule(globals())
# How often a web process writes the guard checks' counts (guard/records.py).
LLMGW_GUARD_FLUSH_MS = envint("GUARD_FLUSH_MS", 500)
# A judge's timeout (seconds) when its model has no slo.ttft_p99 (guard/client.py
# judge_timeout), and its circuit breaker (guard/breaker.py): skipped after this many
# failures in a row, for a back-off (seconds) that doubles after each failed probe, up to
# the most. Per process (docs/gateway.md, "Judges that fail").
LLMGW_GUARD_JUDGE_TIMEOUT = envint("GUARD_JUDGE_TIMEOUT", 5)
LLMGW_GUARD_BREAKER_FAILURES = envint("GUARD_BREAKER_FAILURES", 5)
LLMGW_GUARD_BREAKER_BACKOFF = envint("GUARD_BREAKER_BACKOFF", 5)
LLMGW_GUARD_BREAKER_MAX_BACKOFF = envint("GUARD_BREAKER_MAX_BACKOFF", 300)
# How often a process asks a judge whose breaker is open, off the path (guard.reprobe):
# its first answer closes the breaker. 0: never (only the checks' probes after back-off).
LLMGW_GUARD_BREAKER_PROBE_EVERY = envint("GUARD_BREAKER_PROBE_EVERY", 1)
if LLMGW_GUARD_BREAKER_PROBE_EVERY < 0:
    raise ImproperlyConfigured(
        f"LLMGW_GUARD_BREAKER_PROBE_EVERY is {LLMGW_GUARD_BREAKER_PROBE_EVERY}: write 0 (never) "
        "or more seconds"
    )
for _name in ("JUDGE_TIMEOUT", "BREAKER_FAILURES", "BREAKER_BACKOFF", "BREAKER_MAX_BACKOFF"):
    if globals()[f"LLMGW_GUARD_{_name}"] < 1:
        raise ImproperlyConfigured(
            f"LLMGW_GUARD_{_name} is {globals()[f'LLMGW_GUARD_{_name}']}: write 1 or more"
        )
# The gateway (gateway/path/app.py): timeouts in seconds, the largest body in bytes, and the
# guard's windows on a streamed answer (gateway/path/holdback.py). The first-token, read and
# whole-answer timeouts are for models whose catalog entry gives no slo: one that does
# has its own (catalog/timeouts.py).
LLMGW_GATEWAY_CONNECT_TIMEOUT = envint("GATEWAY_CONNECT_TIMEOUT", 5)
LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT = envint("GATEWAY_FIRST_BYTE_TIMEOUT", 30)
LLMGW_GATEWAY_READ_TIMEOUT = envint("GATEWAY_READ_TIMEOUT", 300)
LLMGW_GATEWAY_WHOLE_TIMEOUT = envint("GATEWAY_WHOLE_TIMEOUT", 1800)
LLMGW_GATEWAY_WAKE_WAIT = envint("GATEWAY_WAKE_WAIT", 600)
LLMGW_GATEWAY_MAX_BODY = envint("GATEWAY_MAX_BODY", 16 << 20)
# Engines (llamacpp, vllm, sglang, trtllm, sim) and model names whose Responses and
# Messages requests are always translated to chat completions, never sent to the engine's
# own route; "all" for every one (gateway/path/dialects/engines.py, docs/dialects.md).
LLMGW_GATEWAY_TRANSLATE_DIALECTS = envlist("GATEWAY_TRANSLATE_DIALECTS", [])
# A gateway process that cannot read the database serves from what it read last; its
# /healthz says "stale" with the age, 200 up to this many seconds, then 503 (gateway/path/health.py).
LLMGW_GATEWAY_STALE_LIMIT = envint("GATEWAY_STALE_LIMIT", 300)
# Every listener (the web process, gateway serve): a request's headers must arrive within
# HEADER_TIMEOUT seconds of its first byte (or of the connection), its body within
# BODY_TIMEOUT of its headers; else the connection is closed (gateway/listener.py).
LLMGW_HTTP_HEADER_TIMEOUT = envint("HTTP_HEADER_TIMEOUT", 10)
LLMGW_HTTP_BODY_TIMEOUT = envint("HTTP_BODY_TIMEOUT", 60)
# A client that takes none of an answer's bytes for this long is taken as gone (gateway).
LLMGW_HTTP_SEND_TIMEOUT = envint("HTTP_SEND_TIMEOUT", 60)
# Processes serving one port (``--workers``; llmgw_core.workers): 0 is one a core. The web
# process's more than one only with LLMGW_REDIS_URL (embedded, it is one process).
LLMGW_GATEWAY_WORKERS = envint("GATEWAY_WORKERS", 0)
LLMGW_WEB_WORKERS = envint("WEB_WORKERS", 1)
for _name in ("GATEWAY_STALE_LIMIT", "HTTP_HEADER_TIMEOUT", "HTTP_BODY_TIMEOUT"):
    if globals()[f"LLMGW_{_name}"] < 1:
        raise ImproperlyConfigured(
            f"LLMGW_{_name} is {globals()[f'LLMGW_{_name}']}: write 1 or more seconds"
        )
# Session affinity (gateway/path/affinity.py): a session's turn goes to its last replica while
# that replica's requests in flight stay within SESSION_SKEW times its weighted share of
# the model's; each gateway process remembers at most SESSION_MAX sessions, each for
# SESSION_AGE seconds after its last turn.
_skew = envstr("SESSION_SKEW", "2")
try:
    LLMGW_SESSION_SKEW = float(_skew)
except ValueError:
    raise ImproperlyConfigured(f"LLMGW_SESSION_SKEW is {_skew!r}: write a number") from None
if not 1 <= LLMGW_SESSION_SKEW <= 100:
    raise ImproperlyConfigured(
        f"LLMGW_SESSION_SKEW is {_skew}: write a number from 1 (a session moves as soon as "
        "its replica holds more than its share) to 100"
    )
LLMGW_SESSION_MAX = envint("SESSION_MAX", 100_000)
LLMGW_SESSION_AGE = envint("SESSION_AGE", 1800)
for _name in ("SESSION_MAX", "SESSION_AGE"):
    if globals()[f"LLMGW_{_name}"] < 1:
        raise ImproperlyConfigured(
            f"LLMGW_{_name} is {globals()[f'LLMGW_{_name}']}: write 1 or more"
        )
# Passive outlier detection (gateway/path/outliers.py, as Envoy's): a replica that fails this
# many attempts in a row (no connection, a broken one, no answer in time, a 5xx) is left
# out of routing for EJECT_SECONDS, longer each time in a row up to EJECT_MAX_SECONDS;
# at most EJECT_MAX_PERCENT of a model's replicas at once (at least one, never all).
LLMGW_GATEWAY_EJECT_AFTER = envint("GATEWAY_EJECT_AFTER", 5)
LLMGW_GATEWAY_EJECT_SECONDS = envint("GATEWAY_EJECT_SECONDS", 30)
LLMGW_GATEWAY_EJECT_MAX_SECONDS = envint("GATEWAY_EJECT_MAX_SECONDS", 300)
LLMGW_GATEWAY_EJECT_MAX_PERCENT = envint("GATEWAY_EJECT_MAX_PERCENT", 50)
if LLMGW_GATEWAY_EJECT_AFTER < 0:
    raise ImproperlyConfigured(
        f"LLMGW_GATEWAY_EJECT_AFTER is {LLMGW_GATEWAY_EJECT_AFTER}: write 1 or more failures "
        "in a row, or 0 to never eject a replica"
    )
if not 1 <= LLMGW_GATEWAY_EJECT_SECONDS <= LLMGW_GATEWAY_EJECT_MAX_SECONDS:
    raise ImproperlyConfigured(
        f"LLMGW_GATEWAY_EJECT_SECONDS is {LLMGW_GATEWAY_EJECT_SECONDS} and "
        f"LLMGW_GATEWAY_EJECT_MAX_SECONDS {LLMGW_GATEWAY_EJECT_MAX_SECONDS}: write 1 or more "
        "seconds, the first at most the second"
    )
if not 0 <= LLMGW_GATEWAY_EJECT_MAX_PERCENT <= 100:
    raise ImproperlyConfigured(
        f"LLMGW_GATEWAY_EJECT_MAX_PERCENT is {LLMGW_GATEWAY_EJECT_MAX_PERCENT}: write 0 to 100"
    )
# Requests a minute each console user may send from the Chat page (gateway/session.py).
LLMGW_CHAT_RPM = envint("CHAT_RPM", 30)
# Admission by priority band (gateway.path.admission): the window a model's TTFT p99 is read
# over (seconds), how long a held request waits at the door before its 429, and how many
# wait a model in one process at most.
LLMGW_ADMISSION_WINDOW = envint("ADMISSION_WINDOW", 10)
LLMGW_ADMISSION_QUEUE_MS = envint("ADMISSION_QUEUE_MS", 2000)
LLMGW_ADMISSION_QUEUE_MAX = envint("ADMISSION_QUEUE_MAX", 100)
if LLMGW_ADMISSION_WINDOW < 1 or LLMGW_ADMISSION_QUEUE_MS < 0 or LLMGW_ADMISSION_QUEUE_MAX < 0:
    raise ImproperlyConfigured(
        "LLMGW_ADMISSION_WINDOW is 1 s or more, LLMGW_ADMISSION_QUEUE_MS and "
        "LLMGW_ADMISSION_QUEUE_MAX 0 or more"
    )
# External providers (catalog/rules/environment.py): the one folder an external model's
# api_key_file may name a file in (unset: no key file is allowed), and the hosts a
# provider may be reached at over plain http besides loopback.
LLMGW_SECRETS_DIR = envstr("SECRETS_DIR")
if LLMGW_SECRETS_DIR and (
    not LLMGW_SECRETS_DIR.startswith("/") or not LLMGW_SECRETS_DIR.strip("/")
):
    raise ImproperlyConfigured(
        f"LLMGW_SECRETS_DIR: {LLMGW_SECRETS_DIR!r} is not a folder's absolute path (or is /, "
        "which holds every file): give the folder's whole path, like /run/secrets/llmgw"
    )
LLMGW_EXTERNAL_HTTP_HOSTS = envlist("EXTERNAL_HTTP_HOSTS", [])
# How often a gateway process writes its usage (gateway/records/usage.py).
LLMGW_GATEWAY_USAGE_FLUSH_MS = envint("GATEWAY_USAGE_FLUSH_MS", 1000)
LLMGW_GUARD_WINDOW_TOKENS = envint("GUARD_WINDOW_TOKENS", 16)
LLMGW_GUARD_WINDOW_MS = envint("GUARD_WINDOW_MS", 150)
# Simulated nodes run beside the web process (llmgw_admin.demo): on by default only on the
# embedded default, so production never simulates unless asked. Embedded, two nodes: the
# demo chat model's replicas spread over four L4s, the on-demand model and the sim judge
# take an H100 each.
SIMULATE_EMBEDDED = "2x nvidia-l4-24gb,1x nvidia-h100-80gb; 2x nvidia-l4-24gb,1x nvidia-h100-80gb"
try:
    LLMGW_SIMULATE = parse_simulate(
        envstr("SIMULATE") or ("off" if DATABASE_URL or REDIS_URL else SIMULATE_EMBEDDED)
    )
except ValueError as exc:
    raise ImproperlyConfigured(f"LLMGW_SIMULATE: {exc}") from None

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
# Failed sign-ins allowed for one user from one address within the window (seconds);
# an address may fail 4 times as often, a user (from anywhere) 20 times (throttle.py).
LLMGW_LOGIN_LIMIT = envint("LOGIN_LIMIT", 5)
LLMGW_LOGIN_WINDOW = envint("LOGIN_WINDOW", 900)
# Proxies whose X-Forwarded-For names the agent a request came from (cluster.address);
# from any other peer the header is ignored. Empty: the connection's own peer.
LLMGW_TRUSTED_PROXIES = envlist("TRUSTED_PROXIES", [])
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = envstr("TIMEZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
# Served by WhiteNoise from the app itself, so one process needs no web server in front.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "llmgw_core.tokens.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["llmgw_core.roles.RolePermission"],
    # DRF's JSON, form and multipart parsers, with JSON refusing deep nesting with 400.
    "DEFAULT_PARSER_CLASSES": [
        "llmgw_core.api.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "llmgw_core.pagination.Pagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "llmgw_core.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw API",
    "DESCRIPTION": "The control plane of a self-hosted LLM cluster.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema is for signed-in users and API tokens (viewers), as the docs page is.
    "SERVE_PERMISSIONS": ["llmgw_core.roles.RolePermission"],
    "COMPONENT_SPLIT_REQUEST": True,
    # The docs page's assets come from the sidecar package, not a CDN (air-gapped).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Each line says when (UTC) and what logged it.
    "formatters": {
        "stamped": {
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
            "()": "llmgw_admin.logfilters.UTCFormatter",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "stamped"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    # channels-redis logs a traceback a second while Redis is away: a line a minute instead.
    "filters": {
        "layer_away": {"()": "llmgw_admin.hub.LayerAway"},
        "agent_answers": {"()": "llmgw_admin.logfilters.AgentAnswers"},
        "repeats": {"()": "llmgw_admin.logfilters.Repeats"},
    },
    # httpx logs every request at INFO: one line per judge call and per agent call.
    "loggers": {
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},  # huggingface_hub's: a line per registry request
        "channels_redis.pubsub": {"filters": ["layer_away"]},
        # An agent's ordinary 404 and 409 from the mirror's API are not warnings.
        "django.request": {"filters": ["agent_answers"]},
        # Celery beat's traceback each time it cannot send a task while Redis is away.
        "celery.beat": {"filters": ["repeats"]},
    },
}
