"""Lua scripts registered once per Redis client, for the calls that take a client rather than an
object that holds one: the classes that hold a client (lifecycle.py, registry.py, watching.py's
``Watching``) register theirs in their constructor; the reaper's calls (``no_worker_count.unserved_for``
and ``count_again``, ``watching.cancel_left``) registered theirs on every call (a registration
hashes the script's text). A script Redis has lost since (SCRIPT FLUSH, a Redis restarted without
it) is loaded again by redis-py on its NOSCRIPT, as for any registered script."""

from __future__ import annotations

import threading
import weakref

import redis
from redis.commands.core import Script

# client -> its scripts by text; an entry goes with its client (a client is dropped with its connections)
_registered: weakref.WeakKeyDictionary[redis.Redis, dict[str, Script]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()  # (the gateway calls from its reaper and from the threadpool's threads)


def registered(client: redis.Redis, script: str) -> Script:
    """``client.register_script(script)``, once per client object and script."""
    with _lock:
        scripts = _registered.get(client)
        if scripts is None:
            scripts = _registered[client] = {}
        found = scripts.get(script)
        if found is None:  # (on a proxy: a Script holds its client, which kept the entry's key for ever)
            found = scripts[script] = Script(weakref.proxy(client), script)
        return found
