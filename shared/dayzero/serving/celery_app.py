"""The workers' Celery app, built from this process's settings (``DAYZERO_REDIS_URL`` ...), for Celery's
own command line: ``celery -A dayzero.serving.celery_app inspect ping -d prefill@HOST`` (compose's
healthchecks). ``celery -b $DAYZERO_REDIS_URL`` read a ``redis+sentinel://`` URL as kombu's plain
``redis`` transport (the sentinel asked as the Redis, the master's name as a database: every worker
unhealthy) and a ``rediss://`` one with kombu's defaults (the server's certificate unchecked); this
app's broker is the workers' own (broker.py's URL forms, transports and TLS settings)."""

from __future__ import annotations

from ..settings_help import settings_from_env
from .queue import make_celery

app = make_celery(settings_from_env())
