"""What a job's pod template may ask of a node: no more than the job spec grants.

gitsched creates pods with its own service account, so whoever may commit a job must not
gain through the template what the job spec does not grant: more GPUs, CPU or memory than
quota, placement and audit count; a privileged pod, the node's filesystem or network; the
controller's own identity; or gitsched's labels and placement. One pure function,
`template_problems`, judges a template; validate, plan and reconcile report what it finds
(policies/rules.py), and the actuator asks it again before it creates a pod.

The security rules are Kubernetes' Pod Security Standards, with their level names
(privileged, baseline, restricted) and their controls, so a cluster's Pod Security
Admission and gitsched agree on what a level allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gitsched.engine.model import PodSecurityPolicy, Resources
from gitsched.engine.units import CPU_MILLI, GPU_MILLI

LEVELS = ("privileged", "baseline", "restricted")
DEFAULT_LEVEL = "baseline"
DEFAULT_SERVICE_ACCOUNT = "default"
# The account `gitsched serve` runs as (deploy/serviceaccount.yaml): never a job's.
CONTROLLER_SERVICE_ACCOUNT = "gitsched"
# Labels and annotations the actuator sets; a template that states one imitates gitsched.
RESERVED_DOMAIN = "gitsched.io"
RESERVED_KEYS = frozenset({"app.kubernetes.io/managed-by"})
GPU_RESOURCE = "nvidia.com/gpu"
# Accounted resources go on the first container; the rest of the pod states none of them.
ACCOUNTED = ("cpu", "memory", GPU_RESOURCE)
# Not scarce, not placed: a container may state its scratch-disk needs.
UNACCOUNTED_ALLOWED = frozenset({"ephemeral-storage"})
# Pod fields that decide where (or before whom) a pod runs: gitsched's to decide.
PLACEMENT_FIELDS = {
    "nodeName": "gitsched binds each replica to the node it decided",
    "nodeSelector": "gitsched places the job (use spec.gpuFlavors, topology, residency)",
    "affinity": "gitsched places the job (use spec.topology and residency)",
    "tolerations": "tolerations would let the pod stay on nodes gitsched keeps for others",
    "schedulerName": "gitsched is the scheduler of its pods",
    "schedulingGates": "gitsched gates the pods of a gang itself",
    "priorityClassName": "a job's priority is spec.priorityClass",
    "priority": "a job's priority is spec.priorityClass",
}
# Ways to reach resources around the accounting: pod-level figures and devices by claim.
UNACCOUNTED_POD_FIELDS = {
    "resources": "pod-level resources",
    "overhead": "pod overhead",
    "resourceClaims": "resource claims (devices gitsched does not account)",
}

CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
# The NVIDIA container toolkit hands a container the devices these name, whatever the pod
# requests (unless the node's toolkit is told to ignore them): a GPU around the accounting.
DEVICE_ENV = frozenset(
    {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"}
)
# Pod Security Standards, baseline: capabilities a container may add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
PROFILE_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class TemplateProblem:
    """One thing a template may not do: where (a path inside the template), what, and the
    rule it breaks (`resources`, `pod-security`, `service-account` or `reserved`)."""

    path: Path
    message: str
    code: str


def pod_security_policy(spec: Mapping[str, Any]) -> PodSecurityPolicy:
    """The engine's PodSecurityPolicy from a merged Policy spec (policies.merge_policies)."""
    section = spec.get("podSecurity")
    section = section if isinstance(section, Mapping) else {}
    base = PodSecurityPolicy()
    teams = section.get("teams")
    accounts = section.get("serviceAccounts")
    return PodSecurityPolicy(
        level=str(section.get("level", base.level)),
        teams=tuple(sorted((str(k), str(v)) for k, v in teams.items()))
        if isinstance(teams, Mapping)
        else base.teams,
        service_accounts=tuple(sorted({str(a) for a in accounts}))
        if isinstance(accounts, list)
        else base.service_accounts,
    )


def template_problems(
    template: Mapping[str, Any] | None,
    granted: Resources,
    level: str,
    service_accounts: Sequence[str],
) -> tuple[TemplateProblem, ...]:
    """Everything `template` (a PodTemplateSpec; None when the job has none) may not do,
    for a job granted `granted` per replica, held to Pod Security Standard `level`, that may
    run as one of `service_accounts`. Paths are inside the template; no problem: ()."""
    if not template and DEFAULT_SERVICE_ACCOUNT in service_accounts:
        return ()  # the pod gitsched makes of no template asks for nothing (cluster/pods.py)
    template = template if isinstance(template, Mapping) else {}
    meta = _map(template.get("metadata"))
    spec = _map(template.get("spec"))
    found: list[TemplateProblem] = []
    containers = spec.get("containers")
    if not (
        isinstance(containers, list)
        and containers
        and all(isinstance(c, Mapping) for c in containers)
    ):
        # The schema says so for a new commit; a job an older log holds may still have it.
        found.append(
            TemplateProblem(
                ("spec", "containers"),
                "must list at least one container, each a mapping",
                "pod-spec",
            )
        )
    found.extend(_resources(spec, granted))
    found.extend(_placement(spec))
    found.extend(_reserved_metadata(meta))
    found.extend(_service_account(spec, service_accounts))
    if level != "privileged":
        found.extend(_baseline(meta, spec))
    if level == "restricted":
        found.extend(_restricted(spec))
    return tuple(found)


# --- resources: the job spec's figures, on the first container, and nothing else ---


def granted_quantities(granted: Resources) -> dict[str, Fraction]:
    """What one replica's pod gets of each accounted resource (0: none)."""
    return {
        "cpu": Fraction(granted.cpu_milli, CPU_MILLI),
        "memory": Fraction(granted.memory_mib * 1024 * 1024),
        GPU_RESOURCE: Fraction(granted.gpu_milli // GPU_MILLI if not granted.fractional else 0),
    }


def _resources(spec: Mapping[str, Any], granted: Resources) -> Iterator[TemplateProblem]:
    grants = granted_quantities(granted)
    for field, what in UNACCOUNTED_POD_FIELDS.items():
        if spec.get(field) not in (None, {}, []):
            yield TemplateProblem(
                ("spec", field),
                f"{what} are not allowed: a pod gets the cpu, memory and GPUs of"
                " spec.resources, on its first container",
                "resources",
            )
    for kind, index, container in _containers(spec):
        at: Path = ("spec", kind, index, "resources")
        resources = _map(container.get("resources"))
        main = kind == "containers" and index == 0
        if resources.get("claims") not in (None, []):
            yield TemplateProblem(
                (*at, "claims"),
                "resource claims reach devices gitsched does not account; a pod gets only"
                " the cpu, memory and GPUs of spec.resources",
                "resources",
            )
        for i, variable in enumerate(_list(container.get("env"))):
            if _map(variable).get("name") in DEVICE_ENV:
                yield TemplateProblem(
                    ("spec", kind, index, "env", i, "name"),
                    f"{_container(kind, index, container)} sets"
                    f" {_map(variable).get('name')}, which hands it GPUs gitsched does not"
                    " account; a pod gets the GPUs of spec.resources",
                    "resources",
                )
        for section in ("requests", "limits"):
            for name, value in _map(resources.get(section)).items():
                where = (*at, section, name)
                if name in UNACCOUNTED_ALLOWED:
                    continue
                if name not in ACCOUNTED:
                    yield TemplateProblem(
                        where,
                        f"{_container(kind, index, container)} asks for {_text(name)}, which"
                        " gitsched does not account; a pod gets only the cpu, memory and"
                        " GPUs of spec.resources",
                        "resources",
                    )
                elif not main:
                    yield TemplateProblem(
                        where,
                        f"{_container(kind, index, container)} asks for {name}"
                        f" {_text(value)}; only the first container gets the job's"
                        f" resources: put the whole replica's {_noun(name)} in"
                        " spec.resources and gitsched sets it on the first container",
                        "resources",
                    )
                elif quantity(value) != grants[name]:
                    yield TemplateProblem(
                        where,
                        f"{_container(kind, index, container)} asks for {name}"
                        f" {_text(value)} but spec.resources grants {_grant(name, granted)}"
                        " per replica; drop it (gitsched sets it from spec.resources) or"
                        " change spec.resources",
                        "resources",
                    )


_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def quantity(value: object) -> Fraction | None:
    """A Kubernetes resource quantity ("500m", "16Gi", "8", 2, "1e3") exactly; None when
    `value` is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str) or len(value) > 64:
        return None
    match = _QUANTITY.match(value.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    amount = Fraction(number)
    if exponent:
        power = int(exponent[1:])
        if abs(power) > 30:
            return None
        amount *= Fraction(10) ** power
    return amount * _SUFFIX[suffix or ""]


def _grant(name: str, granted: Resources) -> str:
    if name == "cpu":
        return f"{granted.cpu_milli}m" if granted.cpu_milli else "no cpu"
    if name == "memory":
        return f"{granted.memory_mib}Mi" if granted.memory_mib else "no memory"
    if granted.fractional:
        return f"a {granted.gpu_milli / GPU_MILLI:g} share of one GPU (no {GPU_RESOURCE})"
    whole = granted.gpu_milli // GPU_MILLI
    return f"{whole} GPU{'s' if whole != 1 else ''}" if whole else "no GPUs"


def _noun(name: str) -> str:
    return "GPUs" if name == GPU_RESOURCE else name


# --- placement and identity: gitsched's, never the template's ---


def _placement(spec: Mapping[str, Any]) -> Iterator[TemplateProblem]:
    for field, why in PLACEMENT_FIELDS.items():
        if spec.get(field) not in (None, "", {}, []):
            yield TemplateProblem(("spec", field), f"must not set {field}: {why}", "reserved")


def _reserved_metadata(meta: Mapping[str, Any]) -> Iterator[TemplateProblem]:
    for section in ("labels", "annotations"):
        for key in _map(meta.get(section)):
            if is_reserved_key(str(key)):
                yield TemplateProblem(
                    ("metadata", section, key),
                    f"{section[:-1]} '{key}' imitates gitsched's own (the {RESERVED_DOMAIN}/"
                    " prefix and app.kubernetes.io/managed-by are set by gitsched alone)",
                    "reserved",
                )


def is_reserved_key(key: str) -> bool:
    """A label or annotation key only gitsched may set."""
    if key in RESERVED_KEYS:
        return True
    prefix = key.split("/", 1)[0].lower() if "/" in key else ""
    return prefix == RESERVED_DOMAIN or prefix.endswith("." + RESERVED_DOMAIN)


def _service_account(spec: Mapping[str, Any], allowed: Sequence[str]) -> Iterator[TemplateProblem]:
    named = [
        (field, spec[field])
        for field in ("serviceAccountName", "serviceAccount")
        if spec.get(field) not in (None, "")
    ]
    if not named:
        if DEFAULT_SERVICE_ACCOUNT not in allowed:
            yield TemplateProblem(
                ("spec",),
                "names no serviceAccountName, so the pod would run as the namespace's"
                f" '{DEFAULT_SERVICE_ACCOUNT}' account, which the policy does not list"
                f" (podSecurity.serviceAccounts: {_names(allowed)})",
                "service-account",
            )
        return
    for field, account in named:
        if account == CONTROLLER_SERVICE_ACCOUNT:
            yield TemplateProblem(
                ("spec", field),
                f"must not run as '{account}': that is gitsched's own service account",
                "service-account",
            )
        elif account not in allowed:
            yield TemplateProblem(
                ("spec", field),
                f"service account {_text(account)} is not one the policy lists"
                f" (podSecurity.serviceAccounts: {_names(allowed)})",
                "service-account",
            )


# --- Pod Security Standards ---


def _baseline(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Iterator[TemplateProblem]:
    pod_context = _map(spec.get("securityContext"))
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field) not in (None, False):
            yield _pss(("spec", field), f"{field} shares the node's namespace", "baseline")
    for index, volume in enumerate(_list(spec.get("volumes"))):
        if isinstance(volume, Mapping) and "hostPath" in volume:
            path = _map(volume.get("hostPath")).get("path", "?")
            yield _pss(
                ("spec", "volumes", index, "hostPath"),
                f"hostPath volume {_text(volume.get('name', index))} mounts the node's"
                f" {_text(path)}",
                "baseline",
            )
    yield from _context_baseline(("spec", "securityContext"), pod_context, "the pod")
    for index, sysctl in enumerate(_list(pod_context.get("sysctls"))):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            yield _pss(
                ("spec", "securityContext", "sysctls", index, "name"),
                f"sysctl {_text(name)} is not one of the safe set",
                "baseline",
            )
    for key, value in _map(meta.get("annotations")).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default"
            or (isinstance(value, str) and value.startswith("localhost/"))
        ):
            yield _pss(
                ("metadata", "annotations", key),
                f"AppArmor profile {_text(value)} (runtime/default or localhost/* only)",
                "baseline",
            )
    for kind, index, container in _containers(spec):
        at: Path = ("spec", kind, index)
        who = _container(kind, index, container)
        context = _map(container.get("securityContext"))
        if context.get("privileged") not in (None, False):
            yield _pss((*at, "securityContext", "privileged"), f"{who} is privileged", "baseline")
        added = _list(_map(context.get("capabilities")).get("add"))
        for i, capability in enumerate(added):
            if capability not in BASELINE_CAPABILITIES:
                yield _pss(
                    (*at, "securityContext", "capabilities", "add", i),
                    f"{who} adds capability {_text(capability)}",
                    "baseline",
                )
        if context.get("procMount") not in (None, "Default"):
            yield _pss(
                (*at, "securityContext", "procMount"),
                f"{who} asks procMount {_text(context.get('procMount'))}",
                "baseline",
            )
        yield from _context_baseline((*at, "securityContext"), context, who)
        for i, port in enumerate(_list(container.get("ports"))):
            if _map(port).get("hostPort") not in (None, 0):
                yield _pss(
                    (*at, "ports", i, "hostPort"),
                    f"{who} opens hostPort {_text(_map(port).get('hostPort'))} on the node",
                    "baseline",
                )


def _context_baseline(at: Path, context: Mapping[str, Any], who: str) -> Iterator[TemplateProblem]:
    """The controls a pod's and a container's securityContext share."""
    if _map(context.get("windowsOptions")).get("hostProcess") not in (None, False):
        yield _pss((*at, "windowsOptions", "hostProcess"), f"{who} is a HostProcess", "baseline")
    seccomp = _map(context.get("seccompProfile")).get("type")
    if seccomp not in (None, *PROFILE_TYPES):
        yield _pss(
            (*at, "seccompProfile", "type"),
            f"{who} runs with seccomp profile {_text(seccomp)} (RuntimeDefault or Localhost)",
            "baseline",
        )
    apparmor = _map(context.get("appArmorProfile")).get("type")
    if apparmor not in (None, *PROFILE_TYPES):
        yield _pss(
            (*at, "appArmorProfile", "type"),
            f"{who} runs with AppArmor profile {_text(apparmor)} (RuntimeDefault or Localhost)",
            "baseline",
        )
    selinux = _map(context.get("seLinuxOptions"))
    if selinux.get("type") not in (None, *SELINUX_TYPES):
        yield _pss(
            (*at, "seLinuxOptions", "type"),
            f"{who} asks SELinux type {_text(selinux.get('type'))}",
            "baseline",
        )
    for field in ("user", "role"):
        if selinux.get(field) not in (None, ""):
            yield _pss((*at, "seLinuxOptions", field), f"{who} sets an SELinux {field}", "baseline")


def _restricted(spec: Mapping[str, Any]) -> Iterator[TemplateProblem]:
    pod_context = _map(spec.get("securityContext"))
    for index, volume in enumerate(_list(spec.get("volumes"))):
        kinds = [k for k in _map(volume) if k != "name"]
        for kind in kinds:
            if kind not in RESTRICTED_VOLUMES and kind != "hostPath":  # hostPath: baseline says
                yield _pss(
                    ("spec", "volumes", index, kind),
                    f"volume type {kind} (allowed: {', '.join(sorted(RESTRICTED_VOLUMES))})",
                    "restricted",
                )
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = _map(pod_context.get("seccompProfile")).get("type") in PROFILE_TYPES
    if pod_context.get("runAsNonRoot") is False:
        yield _pss(
            ("spec", "securityContext", "runAsNonRoot"), "the pod runs as root", "restricted"
        )
    if pod_context.get("runAsUser") == 0:
        yield _pss(("spec", "securityContext", "runAsUser"), "the pod runs as user 0", "restricted")
    for kind, index, container in _containers(spec):
        at: Path = ("spec", kind, index, "securityContext")
        who = _container(kind, index, container)
        context = _map(container.get("securityContext"))
        if context.get("allowPrivilegeEscalation") is not False:
            yield _pss(
                (*at, "allowPrivilegeEscalation"),
                f"{who} must set allowPrivilegeEscalation: false",
                "restricted",
            )
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            yield _pss(
                (*at, "runAsNonRoot"),
                f"{who} must run as non-root (runAsNonRoot: true, here or for the pod)",
                "restricted",
            )
        if context.get("runAsUser") == 0:
            yield _pss((*at, "runAsUser"), f"{who} runs as user 0", "restricted")
        seccomp = _map(context.get("seccompProfile")).get("type")
        if seccomp is None and not pod_seccomp:
            yield _pss(
                (*at, "seccompProfile", "type"),
                f"{who} must set seccompProfile RuntimeDefault or Localhost (here or for the pod)",
                "restricted",
            )
        capabilities = _map(context.get("capabilities"))
        if "ALL" not in _list(capabilities.get("drop")):
            yield _pss(
                (*at, "capabilities", "drop"), f"{who} must drop ALL capabilities", "restricted"
            )
        for i, capability in enumerate(_list(capabilities.get("add"))):
            if capability in BASELINE_CAPABILITIES and capability not in RESTRICTED_CAPABILITIES:
                yield _pss(
                    (*at, "capabilities", "add", i),
                    f"{who} adds capability {_text(capability)} (only NET_BIND_SERVICE)",
                    "restricted",
                )


def _pss(path: Path, what: str, level: str) -> TemplateProblem:
    return TemplateProblem(path, f"{what} (Pod Security Standard '{level}')", "pod-security")


# --- small pieces: a template is free-form, so every value may have any shape ---


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    for kind in CONTAINER_KINDS:
        for index, container in enumerate(_list(spec.get(kind))):
            yield kind, index, _map(container)


def _container(kind: str, index: int, container: Mapping[str, Any]) -> str:
    noun = {"containers": "container", "initContainers": "init container"}.get(
        kind, "ephemeral container"
    )
    name = container.get("name")
    return f"{noun} {_text(name)}" if isinstance(name, str) else f"{noun} {index}"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: object) -> str:
    """A value a committer wrote, as a message shows it: quoted when text, and short."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"
