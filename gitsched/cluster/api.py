"""The few Kubernetes API calls gitsched makes, on plain JSON dicts.

Every call goes through the official client with `_preload_content=False` and
is decoded here: the client's models cost more than the objects are worth to a
controller, and its Binding model cannot decode the server's reply (client
37.x raises on a successful `create_namespaced_pod_binding` otherwise).
Library errors become `ClusterUnavailable` (retry) or `ClusterRefused`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch

from gitsched.engine.errors import PermanentError, TemporaryError

log = logging.getLogger("gitsched.cluster")

Obj = dict[str, Any]
# The client's typed models are not used here (plain dicts go in and out), so its
# loaders and API objects are held as Any.
config: Any = _config
iter_resp_lines: Any = _watch.iter_resp_lines


class ClusterUnavailable(TemporaryError):
    """The API server did not answer, or answered with a server-side error: retry."""


class ClusterRefused(PermanentError):
    """The API server refused a request for good (forbidden, invalid object)."""


class WatchExpired(TemporaryError):
    """410 Gone: the resourceVersion to resume from is compacted away; list again."""


@dataclass(frozen=True, slots=True)
class Listed:
    items: list[Obj]
    resource_version: str


def _wrap(e: Exception, what: str) -> Exception:
    if isinstance(e, ApiException):
        status = e.status or 0
        if status == 0 or status >= 500 or status == 429:
            return ClusterUnavailable(f"{what}: {status} {e.reason}")
        return ClusterRefused(f"{what}: {status} {e.reason}: {_message(e)}")
    return ClusterUnavailable(f"{what}: {e}")


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message", ""))
    except ValueError:
        return str(e.body or "")


# Connections kept open to the API server: the actuator's workers and the two watches
# each hold one; a request that finds none idle pays a TLS handshake.
POOL_SIZE = 40


def _json(resp: Any) -> Obj:
    data: Obj = json.loads(resp.data)
    resp.release_conn()
    return data


def release(resp: Any) -> None:
    """Read the reply to its end and give the connection back to the pool.

    With `_preload_content=False` nobody else does: an unread reply keeps its
    connection, and the next call opens a new one (TCP and TLS handshake each time).
    """
    resp.drain_conn()
    resp.release_conn()


# Every request is bounded unless it names its own bound (a watch does): (connect, read)
# seconds, the read bound being the longest silence between bytes. The API server answers
# a slow request itself within its --request-timeout (1 min); this bounds what it never
# answers (a connection dropped on the way), which would hold a pass, and a stop, for good.
REQUEST_TIMEOUT_S = (10.0, 30.0)


class _BoundedApiClient(client.ApiClient):
    def __init__(self, configuration: Any, request_timeout: float | tuple[float, float]) -> None:
        super().__init__(configuration)
        self.request_timeout = request_timeout

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout
        return super().call_api(*args, **kwargs)


class KubeApi:
    """One connection to one API server."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core: Any = client.CoreV1Api(api_client)
        self.coordination: Any = client.CoordinationV1Api(api_client)

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        request_timeout_s: float | tuple[float, float] = REQUEST_TIMEOUT_S,
    ) -> KubeApi:
        """From a kubeconfig file; without one, the in-cluster service account, then
        ~/.kube/config. Every request is bounded by `request_timeout_s` (connect, read)
        unless it names its own bound."""
        try:
            configuration = client.Configuration()
            configuration.connection_pool_maxsize = POOL_SIZE
            # A connection refused or reset is tried again; a request sent and not answered
            # in time is not (the read bound is the caller's whole bound, not a quarter of
            # it): the pass retries it, as every ClusterUnavailable.
            configuration.retries = urllib3.Retry(total=3, read=0, status=0, redirect=0)
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                except config.ConfigException:
                    config.load_kube_config(client_configuration=configuration)
            return cls(_BoundedApiClient(configuration, request_timeout_s))
        except (config.ConfigException, OSError, ValueError) as e:
            raise ClusterRefused(f"cannot read the Kubernetes configuration: {e}") from e

    # -- reading ------------------------------------------------------------------------

    def list(self, kind: str, label_selector: str = "") -> Listed:
        fn = self._lister(kind)
        try:
            data = _json(fn(label_selector=label_selector, _preload_content=False))
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            raise _wrap(e, f"list {kind}") from e
        return Listed(data.get("items") or [], data["metadata"]["resourceVersion"])

    def watch(
        self, kind: str, resource_version: str, label_selector: str = "", timeout_s: int = 60
    ) -> Iterator[tuple[str, Obj]]:
        """(type, object) from `resource_version` on, bookmarks included, for up to timeout_s.

        Raises WatchExpired on 410 Gone: the caller lists again.
        """
        fn = self._lister(kind)
        try:
            resp = fn(
                watch=True,
                resource_version=resource_version,
                label_selector=label_selector,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _request_timeout=timeout_s + 10,
                _preload_content=False,
            )
        except ApiException as e:
            if e.status == 410:
                raise WatchExpired(resource_version) from e
            raise _wrap(e, f"watch {kind}") from e
        except urllib3.exceptions.HTTPError as e:
            raise _wrap(e, f"watch {kind}") from e
        try:
            for line in iter_resp_lines(resp):
                if not line:
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    status = event["object"]
                    if status.get("code") == 410:
                        raise WatchExpired(resource_version)
                    raise ClusterUnavailable(f"watch {kind}: {status.get('message')}")
                yield event["type"], event["object"]
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _wrap(e, f"watch {kind}") from e
        finally:
            resp.close()
            resp.release_conn()

    def _lister(self, kind: str) -> Any:
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces
        if kind == "nodes":
            return self.core.list_node
        raise ValueError(kind)

    # -- pods ---------------------------------------------------------------------------

    def ensure_namespace(self, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        try:
            release(self.core.create_namespace(body, _preload_content=False))
        except ApiException as e:
            if e.status != 409:
                raise _wrap(e, f"create namespace {name}") from e
        except urllib3.exceptions.HTTPError as e:
            raise _wrap(e, f"create namespace {name}") from e

    def create_pod(self, namespace: str, body: Obj) -> Obj | None:
        """The created pod, or None when one of that name exists already (409)."""
        name = body["metadata"]["name"]
        try:
            return _json(self.core.create_namespaced_pod(namespace, body, _preload_content=False))
        except ApiException as e:
            if e.status == 409:
                return None
            raise _wrap(e, f"create pod {namespace}/{name}") from e
        except urllib3.exceptions.HTTPError as e:
            raise _wrap(e, f"create pod {namespace}/{name}") from e

    def remove_scheduling_gates(self, namespace: str, name: str) -> None:
        """Lift the pod's scheduling gates (the API allows removing them, never adding)."""
        patch = {"spec": {"schedulingGates": None}}
        try:
            release(self.core.patch_namespaced_pod(name, namespace, patch, _preload_content=False))
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            raise _wrap(e, f"ungate pod {namespace}/{name}") from e

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        """Bind the pod to `node`: True if this call bound it, False if it was bound already (409)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            # The uid: a pod deleted and made again under the same name is not bound by mistake.
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            release(
                self.core.create_namespaced_pod_binding(
                    name, namespace, body, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise _wrap(e, f"bind pod {namespace}/{name} to {node}") from e
        except urllib3.exceptions.HTTPError as e:
            raise _wrap(e, f"bind pod {namespace}/{name} to {node}") from e
        return True

    def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None:
        """Delete that very pod (uid precondition) with a grace period; gone already is fine."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace_period_s,
            "preconditions": {"uid": uid},
        }
        try:
            release(
                self.core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False)
            )
        except ApiException as e:
            if e.status in (404, 409):
                return
            raise _wrap(e, f"delete pod {namespace}/{name}") from e
        except urllib3.exceptions.HTTPError as e:
            raise _wrap(e, f"delete pod {namespace}/{name}") from e
