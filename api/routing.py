"""Request routing with werkzeug's rules, remembering recent matches.

werkzeug's matcher builds a recursive closure for every request it matches: a reference cycle of about eight
objects (the closure, its cells, a set). Under commit load those were nearly all the cyclic garbage the service
made, and the collector's young-generation passes that freed them (every few seconds at 500 commits/s, 5-13 ms
each, every request waiting) came from them. Streaming writers commit to the same few table paths over and over,
so the matches are remembered: a repeated path is matched without calling werkzeug at all.

Only successful matches are cached (an unknown path, a wrong method or a redirect is matched afresh each time),
the cache is bounded in entries and in path length, and it is emptied when the rules change.
"""

from __future__ import annotations

import functools
from collections.abc import MutableMapping
from typing import Any

from quart.routing import QuartMap
from werkzeug.routing import Rule
from werkzeug.routing.matcher import StateMachineMatcher

ROUTE_CACHE_SIZE = 4096   # (path, method) pairs: the hot tables' commit and load paths
# Longer paths are matched afresh: routing runs before authentication, so anyone could otherwise fill the cache
# with long made-up paths (up to hypercorn's 16 KiB request line each). This bounds it at a few MiB.
MAX_CACHED_PATH = 512


class CachingMatcher(StateMachineMatcher):
    def __init__(self, merge_slashes: bool) -> None:
        super().__init__(merge_slashes)
        self._remembered = functools.lru_cache(maxsize=ROUTE_CACHE_SIZE)(super().match)

    def update(self) -> None:
        super().update()
        self._remembered.cache_clear()

    def match(self, domain: str, path: str, method: str, websocket: bool) -> tuple[Rule, MutableMapping[str, Any]]:
        if len(path) > MAX_CACHED_PATH:
            return super().match(domain, path, method, websocket)
        rule, values = self._remembered(domain, path, method, websocket)
        return rule, dict(values)   # the caller may change its copy (url_value_preprocessors pop from it)


class CachingMap(QuartMap):
    def __init__(self, rules: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(None, *args, **kwargs)
        # werkzeug's Map keeps its matcher in `_matcher`, with no public way to supply another: replace it before
        # any rule is added to it. Both are private to werkzeug, which is held to the tested releases for this
        # (api/dependencies.py).
        self._matcher = CachingMatcher(self._matcher.merge_slashes)
        for rule in rules or ():
            self.add(rule)
