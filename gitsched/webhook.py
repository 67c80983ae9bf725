"""What `gitsched serve` makes of a git host's push delivery: its signature, the push it
announces, and whether it was delivered before. No HTTP here (gitsched.http reads the
request, bounded); a delivery only ever wakes the daemon, the commit itself is read from git.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from urllib.parse import parse_qs

# GitHub caps its payloads at 25 MB; a push of one branch is far less.
MAX_WEBHOOK_BYTES = 5 * 1024 * 1024
NO_COMMIT = "0" * 40  # the `after` of a push that deleted the branch
# A replayed delivery is recognised among this many, for this long (a day: longer than
# any git host retries, short enough that the memory stays small: 64 bytes a delivery).
DELIVERIES_REMEMBERED = 10_000
DELIVERY_WINDOW_S = 24 * 3600.0


class WebhookSecretMissing(ValueError):
    pass


class Webhook:
    """Push deliveries from a git host (GitHub, Gitea, Forgejo, GitLab's compatible mode),
    signed with a shared secret: HMAC-SHA256 of the body, in `X-Hub-Signature-256`
    (`sha256=<hex>`) or Gitea's `X-Gitea-Signature` (`<hex>`)."""

    def __init__(self, secret: bytes, branch: str) -> None:
        if not secret:
            raise WebhookSecretMissing("the webhook secret is empty")
        self.secret = secret
        self.ref = f"refs/heads/{branch}"
        self.deliveries = Deliveries()

    def signature(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """The body's verified signature (hex), or None when it is missing or wrong."""
        sent = (headers.get("X-Hub-Signature-256") or "").strip()
        if sent:
            algorithm, _, sent = sent.partition("=")
            if algorithm != "sha256":
                return None
        else:
            sent = (headers.get("X-Gitea-Signature") or "").strip()
        expected = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        if sent and hmac.compare_digest(expected, sent.lower()):
            return expected
        return None

    def signed(self, body: bytes, headers: Mapping[str, str]) -> bool:
        return self.signature(body, headers) is not None

    def push(self, event: str, body: bytes, content_type: str) -> tuple[int, str, str | None]:
        """What a signed delivery asks for: (HTTP status, reply, the pushed commit to
        reconcile, or None when the delivery asks for nothing)."""
        if event == "ping":
            return 200, "pong", None
        if event not in ("push", ""):
            return 202, f"ignored: {event} is not a push", None
        try:
            # GitHub's other content type: the JSON in a form field `payload`.
            form = parse_qs(body.decode()) if "form-urlencoded" in content_type else {}
            payload = json.loads(form["payload"][0] if "payload" in form else body)
        except (UnicodeDecodeError, ValueError):
            return 400, "the payload is not JSON", None
        if not isinstance(payload, dict) or not isinstance(payload.get("ref"), str):
            return 400, "the payload names no ref", None
        if payload["ref"] != self.ref:
            return 202, f"ignored: a push to {payload['ref']}, not {self.ref}", None
        after = payload.get("after")
        return 202, "reconciling", after if isinstance(after, str) else ""


class Deliveries:
    """Signed deliveries seen lately, to refuse a replay: a delivery is the same when its
    id (`X-GitHub-Delivery`, `X-Gitea-Delivery`) or its signed body was seen. The body
    counts too because the id is not signed: whoever captured a delivery could send it
    again under a new id, but cannot sign another body. Bounded in count and in time."""

    def __init__(
        self,
        capacity: int = DELIVERIES_REMEMBERED,
        window_s: float = DELIVERY_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.window_s = window_s
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()

    def first_time(self, delivery_id: str, signature: str) -> bool:
        """True, and remembered, unless this delivery (by id or by body) was seen before."""
        now = self.clock()
        while self._seen:
            key, at = next(iter(self._seen.items()))
            if len(self._seen) + 2 <= self.capacity and now - at < self.window_s:
                break
            del self._seen[key]
        keys = [f"sig:{signature}"] + ([f"id:{delivery_id[:200]}"] if delivery_id else [])
        if any(k in self._seen for k in keys):
            return False
        for k in keys:
            self._seen[k] = now
        return True

    def __len__(self) -> int:
        return len(self._seen)
