"""A list-then-watch cache of one kind of object, kept by a background thread.

Resumes its watch from the last resourceVersion it saw (bookmarks included);
on 410 Gone it lists again and replaces the cache. Readers take a snapshot;
the controller compares snapshots with the log, so a missed or doubled watch
event costs nothing (level-based, like client-go's informers).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gitsched.cluster.api import ClusterUnavailable, KubeApi, Obj, WatchExpired

log = logging.getLogger("gitsched.cluster")

Key = tuple[str, str]  # (namespace or "", name)


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class Informer:
    def __init__(
        self,
        api: KubeApi,
        kind: str,
        label_selector: str = "",
        *,
        wake: threading.Event | None = None,
        watch_timeout_s: int = 60,
    ) -> None:
        self.api = api
        self.kind = kind
        self.label_selector = label_selector
        self.wake = wake
        self.watch_timeout_s = watch_timeout_s
        self.synced = threading.Event()
        self.relists = 0
        self._objects: dict[Key, Obj] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rv = ""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> dict[Key, Obj]:
        with self._lock:
            return dict(self._objects)

    def relist(self) -> None:
        """List now, in the caller's thread (also what the watch thread does on 410)."""
        listed = self.api.list(self.kind, self.label_selector)
        with self._lock:
            self._objects = {key_of(o): o for o in listed.items}
            self._rv = listed.resource_version
        self.relists += 1
        self.synced.set()
        self._poke()

    def _poke(self) -> None:
        if self.wake is not None:
            self.wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.synced.is_set() or not self._rv:
                    self.relist()
                self._watch()
            except WatchExpired:
                log.info(
                    "%s watch: resourceVersion %s expired (410); listing again", self.kind, self._rv
                )
                self._rv = ""
            except ClusterUnavailable as e:
                log.warning("%s watch: %s; retrying", self.kind, e)
                self._stop.wait(1.0)
            except Exception:  # a bug must not kill the cache silently: log, back off, go on
                log.exception("%s watch failed; listing again", self.kind)
                self._rv = ""
                self._stop.wait(1.0)

    def _watch(self) -> None:
        for kind, obj in self.api.watch(
            self.kind, self._rv, self.label_selector, timeout_s=self.watch_timeout_s
        ):
            if self._stop.is_set():
                return
            rv = obj.get("metadata", {}).get("resourceVersion")
            with self._lock:
                if kind == "DELETED":
                    self._objects.pop(key_of(obj), None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._objects[key_of(obj)] = obj
                if rv:
                    self._rv = rv
            if kind != "BOOKMARK":
                self._poke()

    def put(self, obj: Any) -> None:
        """What a write of ours returned: seen before its watch event arrives."""
        rv = obj.get("metadata", {}).get("resourceVersion", "")
        with self._lock:
            current = self._objects.get(key_of(obj))
            old_rv = current.get("metadata", {}).get("resourceVersion", "") if current else ""
            if _newer_or_unknown(rv, old_rv):
                self._objects[key_of(obj)] = obj


def _newer_or_unknown(rv: str, old_rv: str) -> bool:
    """resourceVersions are opaque; etcd's are integers, and then the older one loses."""
    if not rv or not old_rv:
        return True
    try:
        return int(rv) >= int(old_rv)
    except ValueError:
        return True
