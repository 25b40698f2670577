"""Settings for the toolgate site, read from the environment.

With nothing set it runs on the embedded default: SQLite (``db.sqlite3`` in
the project root) and the in-memory channel layer. ``DATABASE_URL`` and
``REDIS_URL`` switch to the scaled setup (PostgreSQL, channels_redis).
"""

import os
import sys
import warnings
from pathlib import Path

import dj_database_url
import django
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


_DEV_SECRET = "django-insecure-toolgate-development-key-change-me-0123456789abcdef"
_SECRET = os.environ.get("DJANGO_SECRET_KEY", "")
# A secret key set means production unless DJANGO_DEBUG says otherwise.
DEBUG = _env_flag("DJANGO_DEBUG", default=not _SECRET)
if not DEBUG and _SECRET in ("", _DEV_SECRET):
    # The development key is public (it is in this file): sessions, CSRF tokens and
    # password-reset links signed with it can be forged by anyone.
    raise ImproperlyConfigured(
        "DJANGO_DEBUG=0 needs a secret key of its own: set DJANGO_SECRET_KEY to a long "
        "random string, the same in every process of the site (for example the output of "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`), or set "
        "DJANGO_DEBUG=1 for development."
    )
SECRET_KEY = _SECRET or _DEV_SECRET
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if h.strip()
]
if not _SECRET and not os.environ.get("TOOLGATE_QUIET"):
    warnings.warn(
        "DJANGO_SECRET_KEY is not set: using the public development key with DEBUG on. "
        "Set DJANGO_SECRET_KEY and DJANGO_DEBUG=0 in production.",
        stacklevel=1,
    )

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "servestatic",
    "channels",
    "approvals",
    "toolgate_site",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files, before anything that would touch a session or the database.
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

try:
    from django.utils.csp import CSP as _CSP
except ImportError:  # Django 5.2: the inbox page sends its own policy header.
    _CSP = None
if _CSP is not None:
    # No inline script or inline event handler runs anywhere on the site.
    MIDDLEWARE.append("django.middleware.csp.ContentSecurityPolicyMiddleware")
    SECURE_CSP = {
        "default-src": [_CSP.SELF],
        "script-src": [_CSP.SELF],
        "style-src": [_CSP.SELF],
        "img-src": [_CSP.SELF, "data:"],
        "connect-src": [_CSP.SELF],
        "object-src": [_CSP.NONE],
        "base-uri": [_CSP.NONE],
        "form-action": [_CSP.SELF],
        "frame-ancestors": [_CSP.NONE],
    }

ROOT_URLCONF = "toolgate_site.urls"
ASGI_APPLICATION = "toolgate_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_SQLITE_OPTIONS = {
    # Agents and the server write at the same time: WAL lets readers run beside a
    # writer, IMMEDIATE takes the write lock up front (no upgrade deadlocks), and
    # the busy timeout waits for the lock instead of failing.
    "init_command": (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;"
    ),
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=60)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            # Kept between requests, as with DATABASE_URL: opening one (and its
            # PRAGMAs) cost about 0.25 ms of every request.
            "CONN_MAX_AGE": 60,
        }
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"].setdefault("OPTIONS", {}).update(_SQLITE_OPTIONS)
    # Tests use a file (not :memory:) so separate agent processes can share it.
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get(
        "TOOLGATE_TEST_SQLITE", str(BASE_DIR / ".test-db.sqlite3")
    )

if os.environ.get("TOOLGATE_TEST_DB_NAME") and not DATABASES["default"]["ENGINE"].endswith(
    "sqlite3"
):
    # Lets concurrent test runs on one PostgreSQL server use separate test databases.
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ["TOOLGATE_TEST_DB_NAME"]

if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [os.environ["REDIS_URL"]],
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# The site serves its own static files (ServeStatic, an async middleware): with DEBUG
# on straight from the apps' folders, with DEBUG off from STATIC_ROOT as collected by
# `manage.py collectstatic` (make runs it): names carry a hash of the content
# (cached for a year), each with gzip and Brotli variants beside it.
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "toolgate_site.storage.StaticStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/approvals/"
LOGOUT_REDIRECT_URL = "login"

# Django's database sessions and ModelBackend, each reading its row with one
# statement composed once instead of a queryset (approvals.keyread): together
# about 0.6 ms less for every signed-in request. Same tables, same checks.
SESSION_ENGINE = "approvals.sessions"
AUTHENTICATION_BACKENDS = ["approvals.backends.ModelBackend"]

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the inbox page reads it for the X-CSRFToken header
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Behind TLS in production: redirect plain HTTP and send HSTS (see README, "Deploying").
# All off by default: a site still reached over plain HTTP would lock its users out.
SECURE_SSL_REDIRECT = _env_flag("DJANGO_SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_flag("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = _env_flag("DJANGO_HSTS_PRELOAD", default=False)
if _env_flag("DJANGO_SECURE_PROXY_SSL_HEADER", default=False):
    # Only behind a proxy that sets X-Forwarded-Proto itself and drops the client's.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

APPROVALS = {
    "DECISION_TIMEOUT": int(os.environ.get("TOOLGATE_DECISION_TIMEOUT", "3600")),
    # Separate channel-layer groups for separate deployments (or test runs) on one Redis.
    "GROUP_PREFIX": os.environ.get("TOOLGATE_GROUP_PREFIX", "approvals"),
    # Where the site is served, for the links in webhooks and emails.
    "SITE_URL": os.environ.get("TOOLGATE_SITE_URL") or None,
    "EMAIL_NOTIFICATIONS": _env_flag("TOOLGATE_EMAIL_NOTIFICATIONS", default=False),
    # SQLite: the WAL copied back from a thread beside the listener (off: by SQLite itself).
    "SQLITE_CHECKPOINTS": _env_flag("TOOLGATE_SQLITE_CHECKPOINTS", default=True),
}
# Email (for EMAIL_NOTIFICATIONS): SMTP on localhost unless DJANGO_EMAIL_BACKEND says
# otherwise (DJANGO_EMAIL_FILE_PATH for the file backend). Django 6.1 configures mail
# with MAILERS; older versions with the EMAIL_* settings.
_MAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend"
)
if django.VERSION >= (6, 1):
    _MAIL_OPTIONS = {}
    if _MAIL_BACKEND.endswith("filebased.EmailBackend"):
        _MAIL_OPTIONS["file_path"] = os.environ.get("DJANGO_EMAIL_FILE_PATH", "")
    elif _MAIL_BACKEND.endswith("smtp.EmailBackend"):
        _MAIL_OPTIONS["host"] = "localhost"
    MAILERS = {"default": {"BACKEND": _MAIL_BACKEND, "OPTIONS": _MAIL_OPTIONS}}
elif os.environ.get("DJANGO_EMAIL_BACKEND"):
    EMAIL_BACKEND = _MAIL_BACKEND
    EMAIL_FILE_PATH = os.environ.get("DJANGO_EMAIL_FILE_PATH", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "stream": sys.stderr}},
    "loggers": {"approvals": {"handlers": ["console"], "level": "WARNING"}},
}
