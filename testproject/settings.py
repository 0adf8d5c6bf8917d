"""Settings of the project used by the demo, the tests and the benchmarks.

Every address comes from the environment so tests can point it at the
redis-server and database they started (a running demo's Redis also from
the file it writes, see ``TESTPROJECT_REDIS_URL_FILE``).
"""

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent
DATA_DIR = Path(os.environ.get("TESTPROJECT_DATA_DIR", BASE_DIR.parent / ".demo"))

SECRET_KEY = "testproject-only-not-secret"
DEBUG = os.environ.get("TESTPROJECT_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_keyed_queue",
    "testproject.demo",
    "testproject.compat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"

_DB_PATH = os.environ.get("TESTPROJECT_DB", str(DATA_DIR / "db.sqlite3"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _DB_PATH,
        # Workers, the producer and the flusher threads write concurrently.
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": _DB_PATH},
    }
}
# TESTPROJECT_SQLITE=startproject: SQLite as `startproject` makes it (rollback journal, no options), for
# the benchmarks' comparison of the databases users have.
if os.environ.get("TESTPROJECT_SQLITE") == "startproject":
    DATABASES["default"]["OPTIONS"] = {}

# PostgreSQL instead of SQLite: postgresql://USER[:PASSWORD]@[HOST][:PORT]/NAME[?host=/socket/dir]
if os.environ.get("TESTPROJECT_DATABASE_URL"):
    _url = urlsplit(os.environ["TESTPROJECT_DATABASE_URL"])
    if _url.scheme not in ("postgres", "postgresql"):
        raise ValueError("TESTPROJECT_DATABASE_URL must be a postgresql:// URL")
    _name = unquote(_url.path.lstrip("/"))
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _name,
            "USER": unquote(_url.username or ""),
            "PASSWORD": unquote(_url.password or ""),
            "HOST": dict(parse_qsl(_url.query)).get("host", _url.hostname or ""),
            "PORT": str(_url.port or ""),
            # As with SQLite, the tests and the workers they start share one database.
            "TEST": {"NAME": _name},
        }
    }

#: The demo (``python -m testproject.demo.run``) starts redis-server on a free port and writes its URL
#: here while it runs, so that ``testproject/manage.py`` in another shell finds it with nothing exported.
TESTPROJECT_REDIS_URL_FILE = DATA_DIR / "redis-url"


def _redis_url() -> str:
    """``TESTPROJECT_REDIS_URL``, else a running demo's Redis, else the default local server."""
    if "TESTPROJECT_REDIS_URL" in os.environ:
        return os.environ["TESTPROJECT_REDIS_URL"]
    try:
        return TESTPROJECT_REDIS_URL_FILE.read_text().strip() or "redis://127.0.0.1:6379"
    except FileNotFoundError:
        return "redis://127.0.0.1:6379"


_REDIS = _redis_url()
# The gate may live on its own server (the benchmarks count its round trips there).
KEYED_QUEUE_REDIS_URL = os.environ.get("TESTPROJECT_GATE_REDIS_URL", f"{_REDIS}/0")
# Tests of crashes shorten the gate's timings, and the handoff tests lengthen its budget, through the environment.
for _name in (
    *("LEASE_SECONDS", "DISPATCH_TIMEOUT_SECONDS", "REAP_INTERVAL_SECONDS"),
    *("LOCAL_HANDOFF_SECONDS", "RECORD_FLUSH_SECONDS", "RECORD_DELAY_SECONDS"),
):
    if f"KEYED_QUEUE_{_name}" in os.environ:
        globals()[f"KEYED_QUEUE_{_name}"] = float(os.environ[f"KEYED_QUEUE_{_name}"])
CELERY_BROKER_URL = f"{_REDIS}/1"
# TESTPROJECT_RESULTS=0: no result backend. Celery 5.4's Redis result backend with redis-py 5 can
# hang a producer for good when its pub/sub connection reconnects inside an UNSUBSCRIBE (redis-py
# resubscribes under the lock it holds); .ci/versions runs the django tier of Celery 5.4 without it.
CELERY_RESULT_BACKEND = f"{_REDIS}/2" if os.environ.get("TESTPROJECT_RESULTS", "1") == "1" else None
CELERY_TASK_SERIALIZER = "json"
CELERY_WORKER_PREFETCH_MULTIPLIER = int(os.environ.get("TESTPROJECT_PREFETCH", "1"))
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Crash tests restart Redis under running tasks.
CELERY_RESULT_BACKEND_ALWAYS_RETRY = True
CELERY_RESULT_BACKEND_MAX_RETRIES = 20
# Django's tasks framework (Django 6.0+, or the django-tasks backport) on these workers; any queue name.
TASKS = {"default": {"BACKEND": "django_keyed_queue.tasks_backend.CeleryBackend", "QUEUES": []}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_keyed_queue": {"handlers": ["console"], "level": os.environ.get("KEYED_QUEUE_LOG", "INFO")}},
}
