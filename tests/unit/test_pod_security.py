"""A pod template gets no more than the job spec grants: resources, Pod Security Standard
level, service account, gitsched's own labels and placement (policies/pod_security.py), as
validate/plan/reconcile report it (policies/rules.py) and as the pod is made (cluster/pods.py)."""

from __future__ import annotations

import copy
from dataclasses import replace
from fractions import Fraction
from typing import Any, cast

import pytest

from gitsched.cluster.actuator import Actuator
from gitsched.cluster.api import KubeApi
from gitsched.cluster.informer import Informer
from gitsched.cluster.pods import DEFAULT_CONTAINER, desired_pods
from gitsched.engine import events as ev
from gitsched.engine.model import (
    Job,
    Placement,
    PodSecurityPolicy,
    Policy,
    Queue,
    ReplicaPlacement,
    Resources,
)
from gitsched.engine.state import ClusterState
from gitsched.eventlog import codec
from gitsched.eventlog.envelope import GENESIS_HASH, NewEvent, seal
from gitsched.policies import check_repository, merge_policies
from gitsched.policies.pod_security import (
    pod_security_policy,
    quantity,
    template_problems,
)
from gitsched.schemas import Document, parse_documents, validate_document

H = "apiVersion: gitsched.io/v1\n"
CLUSTER = (
    H
    + """kind: Cluster
metadata:
  name: demo
spec:
  topologyLevels: [nvlink, rack, zone]
  gpuFlavors:
    - name: h100-80g
  priorityClasses:
    - {name: normal, value: 500}
  defaultPriorityClass: normal
"""
)
QUEUE = (
    H
    + "kind: Queue\nmetadata:\n  name: vision\nspec:\n  quotas:\n    - {flavor: h100-80g, nominal: 16}\n"
)
JOB = H + "kind: Job\nmetadata:\n  name: {name}\nspec:\n{spec}"
POLICY = H + "kind: Policy\nmetadata:\n  name: {name}\nspec:\n{spec}"


def base_repo() -> dict[str, str]:
    return {"cluster.yaml": CLUSTER, "teams/vision/queue.yaml": QUEUE}


def load(files: dict[str, str]) -> list[Document]:
    docs: list[Document] = []
    for file, text in files.items():
        parsed, errors = parse_documents(text.encode(), file)
        assert errors == (), errors
        for doc in parsed:
            assert validate_document(doc) == (), validate_document(doc)
        docs.extend(parsed)
    return docs


GRANT = Resources(gpu_milli=1000, cpu_milli=4000, memory_mib=16 * 1024)
ACCOUNTS = ("default",)


def main(**extra: Any) -> dict[str, Any]:
    return {"name": "train", "image": "registry.example/train:1", **extra}


def template(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": list(containers) or [main()], **spec}}


def problems(
    tpl: dict[str, Any] | None, level: str = "baseline", grant: Resources = GRANT
) -> list[tuple[tuple[str | int, ...], str]]:
    return [(p.path, p.code) for p in template_problems(tpl, grant, level, ACCOUNTS)]


RESTRICTED_CONTEXT = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def test_a_plain_template_and_none_at_all_are_fine_at_every_level() -> None:
    for level in ("privileged", "baseline"):
        assert problems(template(), level) == []
    assert problems(None) == []
    assert problems(template(main(securityContext=RESTRICTED_CONTEXT)), "restricted") == []
    # Figures equal to the grant may be stated: they are what the pod gets anyway.
    stated = main(
        resources={
            "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
            "limits": {"nvidia.com/gpu": 1, "cpu": "4000m", "memory": "16384Mi"},
        }
    )
    assert problems(template(stated)) == []


def test_more_gpus_in_the_template_than_the_job_is_granted() -> None:
    tpl = template(
        main(resources={"limits": {"nvidia.com/gpu": "8"}}),
        {"name": "sidecar", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
        initContainers=[{"name": "warm", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
    )
    found = template_problems(tpl, GRANT, "baseline", ACCOUNTS)
    assert [(p.path, p.code) for p in found] == [
        (("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"), "resources"),
        (("spec", "containers", 1, "resources", "limits", "nvidia.com/gpu"), "resources"),
        (("spec", "initContainers", 0, "resources", "requests", "cpu"), "resources"),
    ]
    assert "asks for nvidia.com/gpu '8' but spec.resources grants 1 GPU" in found[0].message
    assert "only the first container gets the job's resources" in found[1].message
    assert "init container 'warm'" in found[2].message


def test_cpu_memory_other_resources_and_pod_level_figures() -> None:
    tpl = template(
        main(
            resources={
                "requests": {"cpu": "8", "memory": "1Ti", "ephemeral-storage": "10Gi"},
                "limits": {"amd.com/gpu": "2", "hugepages-2Mi": "1Gi"},
                "claims": [{"name": "gpus"}],
            }
        ),
        resources={"limits": {"cpu": "64"}},
        overhead={"cpu": "1"},
        resourceClaims=[{"name": "gpus", "resourceClaimName": "all-gpus"}],
    )
    assert problems(tpl) == [
        (("spec", "resources"), "resources"),
        (("spec", "overhead"), "resources"),
        (("spec", "resourceClaims"), "resources"),
        (("spec", "containers", 0, "resources", "claims"), "resources"),
        (("spec", "containers", 0, "resources", "requests", "cpu"), "resources"),
        (("spec", "containers", 0, "resources", "requests", "memory"), "resources"),
        (("spec", "containers", 0, "resources", "limits", "amd.com/gpu"), "resources"),
        (("spec", "containers", 0, "resources", "limits", "hugepages-2Mi"), "resources"),
    ]


def test_gpus_by_environment_around_the_device_plugin() -> None:
    tpl = template(
        main(
            env=[
                {"name": "EPOCHS", "value": "3"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            ]
        ),
        initContainers=[
            {"name": "probe", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}
        ],
    )
    assert problems(tpl) == [
        (("spec", "containers", 0, "env", 1, "name"), "resources"),
        (("spec", "initContainers", 0, "env", 0, "name"), "resources"),
    ]


def test_a_share_of_a_gpu_states_no_whole_gpu() -> None:
    share = Resources(gpu_milli=500)
    tpl = template(main(resources={"limits": {"nvidia.com/gpu": "1"}}))
    (found,) = template_problems(tpl, share, "baseline", ACCOUNTS)
    assert "a 0.5 share of one GPU" in found.message


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Fraction(8)),
        (8, Fraction(8)),
        ("500m", Fraction(1, 2)),
        ("16Gi", Fraction(16 * 2**30)),
        ("1e3", Fraction(1000)),
        ("1.5k", Fraction(1500)),
        (".5", Fraction(1, 2)),
        ("8 GPUs", None),
        ("", None),
        (True, None),
        ("1e999", None),
    ],
)
def test_quantities_read_as_kubernetes_reads_them(text: object, value: Fraction | None) -> None:
    assert quantity(text) == value


def test_baseline_refuses_each_known_escape() -> None:
    tpl: dict[str, Any] = {
        "metadata": {
            "annotations": {"container.apparmor.security.beta.kubernetes.io/train": "unconfined"}
        },
        "spec": {
            "hostNetwork": True,
            "hostPID": True,
            "hostIPC": True,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "securityContext": {
                "sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                "seccompProfile": {"type": "Unconfined"},
            },
            "containers": [
                main(
                    securityContext={
                        "privileged": True,
                        "capabilities": {"add": ["SYS_ADMIN", "CHOWN"]},
                        "procMount": "Unmasked",
                        "seLinuxOptions": {"type": "spc_t", "user": "system_u"},
                        "appArmorProfile": {"type": "Unconfined"},
                        "windowsOptions": {"hostProcess": True},
                    },
                    ports=[{"containerPort": 22, "hostPort": 22}],
                )
            ],
        },
    }
    found = problems(tpl)
    assert all(code == "pod-security" for _, code in found)
    paths = {".".join(map(str, path)) for path, _ in found}
    assert paths == {
        "spec.hostNetwork",
        "spec.hostPID",
        "spec.hostIPC",
        "spec.volumes.0.hostPath",
        "spec.securityContext.seccompProfile.type",
        "spec.securityContext.sysctls.0.name",
        "metadata.annotations.container.apparmor.security.beta.kubernetes.io/train",
        "spec.containers.0.securityContext.privileged",
        "spec.containers.0.securityContext.capabilities.add.0",
        "spec.containers.0.securityContext.procMount",
        "spec.containers.0.securityContext.windowsOptions.hostProcess",
        "spec.containers.0.securityContext.appArmorProfile.type",
        "spec.containers.0.securityContext.seLinuxOptions.type",
        "spec.containers.0.securityContext.seLinuxOptions.user",
        "spec.containers.0.ports.0.hostPort",
    }
    # The privileged level allows every one of them, and nothing else changes.
    assert problems(tpl, "privileged") == []


def test_an_init_container_is_held_to_the_same_level() -> None:
    tpl = template(initContainers=[{"name": "setup", "securityContext": {"privileged": True}}])
    assert problems(tpl) == [
        (("spec", "initContainers", 0, "securityContext", "privileged"), "pod-security")
    ]


def test_restricted_adds_non_root_no_escalation_drop_all_seccomp_and_volume_types() -> None:
    tpl = template(
        main(securityContext={"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE"]}}),
        volumes=[
            {"name": "data", "nfs": {"server": "x", "path": "/"}},
            {"name": "s", "emptyDir": {}},
        ],
    )
    assert problems(tpl, "baseline") == []
    at = ("spec", "containers", 0, "securityContext")
    assert problems(tpl, "restricted") == [
        (("spec", "volumes", 0, "nfs"), "pod-security"),
        ((*at, "allowPrivilegeEscalation"), "pod-security"),
        ((*at, "runAsNonRoot"), "pod-security"),
        ((*at, "seccompProfile", "type"), "pod-security"),
        ((*at, "capabilities", "drop"), "pod-security"),
        ((*at, "capabilities", "add", 0), "pod-security"),
    ]
    # runAsNonRoot and seccomp may be stated once for the pod; root is refused either way.
    pod_level = template(
        main(
            securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        ),
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "Localhost"}},
    )
    assert problems(pod_level, "restricted") == []
    pod_level["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    assert problems(pod_level, "restricted") == [
        (("spec", "containers", 0, "securityContext", "runAsUser"), "pod-security")
    ]


def test_service_accounts_gitsched_labels_and_placement_are_not_the_templates() -> None:
    tpl = {
        "metadata": {
            "labels": {"gitsched.io/queue": "alpha", "app": "train"},
            "annotations": {"gitsched.io/gpus": "0,1,2,3", "x.gitsched.io/y": "z"},
        },
        "spec": {
            "serviceAccountName": "gitsched",
            "nodeName": "h100-a-01",
            "nodeSelector": {"kubernetes.io/hostname": "h100-a-01"},
            "tolerations": [{"operator": "Exists"}],
            "schedulerName": "default-scheduler",
            "containers": [main()],
        },
    }
    found = problems(tpl, "privileged")
    assert found == [
        (("spec", "nodeName"), "reserved"),
        (("spec", "nodeSelector"), "reserved"),
        (("spec", "tolerations"), "reserved"),
        (("spec", "schedulerName"), "reserved"),
        (("metadata", "labels", "gitsched.io/queue"), "reserved"),
        (("metadata", "annotations", "gitsched.io/gpus"), "reserved"),
        (("metadata", "annotations", "x.gitsched.io/y"), "reserved"),
        (("spec", "serviceAccountName"), "service-account"),
    ]
    # gitsched's own account is refused even when the list names it; others must be listed.
    other = template(serviceAccountName="trainer")
    assert template_problems(other, GRANT, "baseline", ("default", "trainer")) == ()
    assert [p.code for p in template_problems(other, GRANT, "baseline", ACCOUNTS)] == [
        "service-account"
    ]
    own = template(serviceAccountName="gitsched")
    assert len(template_problems(own, GRANT, "baseline", ("gitsched",))) == 1
    # No account named: the pod runs as `default`, which must then be on the list.
    (unlisted,) = template_problems(template(), GRANT, "baseline", ("trainer",))
    assert unlisted.path == ("spec",) and "'default' account" in unlisted.message


def test_a_template_without_containers_is_refused_and_makes_no_crash() -> None:
    for spec in ({"containers": []}, {"containers": "all"}, {"containers": [3]}, {}):
        found = template_problems({"spec": spec}, GRANT, "baseline", ACCOUNTS)
        assert [(p.path, p.code) for p in found] == [(("spec", "containers"), "pod-spec")]
        job = Job("odd", "vision", 1, GRANT, "normal", 500, template={"spec": spec})
        (want,) = desired_pods(_state(job)).values()  # the actuator refuses it; no crash
        assert want.body["spec"]["containers"][0]["image"] == DEFAULT_CONTAINER["image"]


def test_hostile_shapes_are_findings_not_crashes() -> None:
    for spec in (
        {"containers": "all of them"},
        {"containers": [None, 3, {"resources": "lots"}], "volumes": {"a": 1}},
        {"containers": [{"securityContext": ["privileged"], "ports": "22"}]},
        {"securityContext": {"sysctls": [None, "x"]}, "containers": []},
    ):
        for level in ("baseline", "restricted"):
            template_problems({"spec": spec, "metadata": []}, GRANT, level, ACCOUNTS)


# --- the Policy section, and the repository check ---


def test_the_policy_section_sets_the_level_per_team_and_the_accounts() -> None:
    assert pod_security_policy({}) == PodSecurityPolicy()
    docs = load(
        {
            "policies/security.yaml": POLICY.format(
                name="security",
                spec="  podSecurity:\n    teams: {vision: restricted, infra: privileged}\n"
                "    serviceAccounts: [trainer, default]\n",
            )
        }
    )
    rules = pod_security_policy(merge_policies(docs))
    assert rules.level == "baseline"
    assert rules.level_of("vision") == "restricted"
    assert rules.level_of("infra") == "privileged"
    assert rules.level_of("nlp") == "baseline"
    assert rules.service_accounts == ("default", "trainer")


HOSTILE_JOB = """\
  replicas: 1
  resources: {gpu: 1, cpu: 4, memoryGiB: 16}
  template:
    metadata:
      labels: {gitsched.io/queue: alpha}
    spec:
      serviceAccountName: gitsched
      hostNetwork: true
      containers:
        - name: train
          image: registry.example/train:1
          resources:
            limits: {nvidia.com/gpu: "8"}
          securityContext: {privileged: true}
        - name: more
          image: registry.example/train:1
          resources:
            limits: {nvidia.com/gpu: "4"}
      volumes:
        - name: root
          hostPath: {path: /}
"""


def test_the_repository_check_reports_each_escape_at_its_line() -> None:
    files = base_repo()
    files["teams/vision/jobs/train.yaml"] = JOB.format(name="train", spec=HOSTILE_JOB)
    docs = load(files)
    found = [
        (e.line, e.path, e.code)
        for e in check_repository(docs, merge_policies(docs))
        if e.file == "teams/vision/jobs/train.yaml"
    ]
    assert found == [
        (10, "$.spec.template.metadata.labels['gitsched.io/queue']", "reserved"),
        (12, "$.spec.template.spec.serviceAccountName", "service-account"),
        (13, "$.spec.template.spec.hostNetwork", "pod-security"),
        (18, "$.spec.template.spec.containers[0].resources.limits['nvidia.com/gpu']", "resources"),
        (19, "$.spec.template.spec.containers[0].securityContext.privileged", "pod-security"),
        (23, "$.spec.template.spec.containers[1].resources.limits['nvidia.com/gpu']", "resources"),
        (26, "$.spec.template.spec.volumes[0].hostPath", "pod-security"),
    ]
    # The team's level decides: privileged lets the security controls pass, never the rest.
    files["policies/security.yaml"] = POLICY.format(
        name="security", spec="  podSecurity:\n    teams: {vision: privileged}\n"
    )
    docs = load(files)
    codes = [e.code for e in check_repository(docs, merge_policies(docs))]
    assert sorted(codes) == ["reserved", "resources", "resources", "service-account"]


# --- the pod gitsched makes: exactly the accounted figures ---


def _state(job: Job) -> ClusterState:
    placement = Placement(job.key, "h100-80g", (ReplicaPlacement("n1", (0,), 1000),), "t0")
    return ClusterState(
        jobs={job.key: job},
        placements={job.key: placement},
        queues={"vision": Queue(name="vision", team="vision")},
    )


def test_the_pod_gets_exactly_the_accounted_figures_whatever_the_template_says() -> None:
    tpl: dict[str, Any] = copy.deepcopy(
        template(
            main(
                resources={
                    "limits": {"nvidia.com/gpu": "8", "cpu": "64", "ephemeral-storage": "5Gi"}
                }
            ),
            {"name": "more", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
            initContainers=[
                {"name": "warm", "image": "x", "resources": {"requests": {"cpu": "9"}}}
            ],
            nodeSelector={"a": "b"},
            overhead={"cpu": "1"},
        )
    )
    job = Job("train", "vision", 1, GRANT, "normal", 500, template=tpl)
    ((_, pod),) = [(k, p.body) for k, p in desired_pods(_state(job)).items()]
    spec = pod["spec"]
    assert spec["containers"][0]["resources"] == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "4000m", "memory": "16384Mi"},
        "limits": {
            "nvidia.com/gpu": "1",
            "cpu": "4000m",
            "memory": "16384Mi",
            "ephemeral-storage": "5Gi",
        },
    }
    assert spec["containers"][1]["resources"] == {}
    assert spec["initContainers"][0]["resources"] == {}
    assert "nodeSelector" not in spec and "overhead" not in spec
    assert job.template == tpl  # the job's own template is left as it was


def test_a_job_without_a_template_runs_a_pod_restricted_allows() -> None:
    job = Job("idle", "vision", 1, Resources(gpu_milli=1000), "normal", 500)
    (want,) = desired_pods(_state(job)).values()
    assert (
        want.body["spec"]["containers"][0]["securityContext"]
        == DEFAULT_CONTAINER["securityContext"]
    )
    found = template_problems({"spec": want.body["spec"]}, job.resources, "restricted", ACCOUNTS)
    # Only what gitsched itself sets on every pod (its scheduler and gate) is left.
    assert {p.path for p in found} == {("spec", "schedulerName"), ("spec", "schedulingGates")}


def test_policy_in_the_engine_defaults_to_the_built_in_level() -> None:
    assert Policy().pod_security == PodSecurityPolicy("baseline", (), ("default",))


# --- the actuator's second wall ---


class RecordingApi:
    """Our cluster adapter, recording the pods the actuator asks it to make."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body)
        return {**body, "metadata": {**body["metadata"], "uid": f"u{len(self.created)}"}}

    def ensure_namespace(self, namespace: str) -> None:
        pass


class StillInformer(Informer):
    """An informer that never watches: the pods it holds are the ones put in it."""

    def __init__(self) -> None:
        super().__init__(cast(KubeApi, None), "pods")


def test_the_actuator_makes_no_pod_of_a_template_the_policy_refuses() -> None:
    tpl = template(main(securityContext={"privileged": True}), hostNetwork=True)
    job = Job("train", "vision", 1, GRANT, "normal", 500, template=tpl)
    state = _state(job)  # a job the log holds: admitted before the rule, say
    api = RecordingApi()
    report = Actuator(cast(KubeApi, api), StillInformer(), workers=1).converge(state)
    assert api.created == []
    (error,) = report.errors
    assert error.startswith("vision/train: no pod made: the pod template breaks the policy")
    assert "template.spec.hostNetwork" in error and "privileged" in error

    # A team the policy lets run privileged pods gets its pod; its figures are the grant's.
    allowed = replace(
        state,
        policy=Policy(pod_security=PodSecurityPolicy(teams=(("vision", "privileged"),))),
    )
    report = Actuator(cast(KubeApi, api), StillInformer(), workers=1).converge(allowed)
    assert report.errors == [] and report.created == 1
    (pod,) = api.created
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize(
    ("section", "path"),
    [
        ("serviceAccounts: [default, gitsched]", "$.spec.podSecurity.serviceAccounts[1]"),
        ("level: sandboxed", "$.spec.podSecurity.level"),
        ("teams: {ml: root}", "$.spec.podSecurity.teams.ml"),
        ("allowHostPath: true", "$.spec.podSecurity.allowHostPath"),
    ],
)
def test_the_policy_schema_refuses_gitscheds_account_and_unknown_levels(
    section: str, path: str
) -> None:
    text = POLICY.format(name="security", spec=f"  podSecurity:\n    {section}\n")
    (doc,), errors = parse_documents(text.encode(), "policies/security.yaml")
    assert errors == ()
    found = validate_document(doc)
    assert [(e.path, e.line) for e in found] == [(path, 7)], found


def test_a_policy_logged_before_pod_security_reads_as_the_built_in_baseline() -> None:
    """PolicyChanged v1 written before the field existed: the built-in default, so the
    actuator's second wall holds an old log's jobs to baseline too."""
    old = seal(
        NewEvent("x/0", "PolicyChanged", 1, {"policy": {"solver": "greedy"}}, "a", "c"),
        seq=1,
        time="2026-01-01T00:00:00.000000Z",
        prev_hash=GENESIS_HASH,
    )
    event = codec.decode(old)
    assert isinstance(event, ev.PolicyChanged)
    assert event.policy.pod_security == PodSecurityPolicy("baseline", (), ("default",))
    assert event.policy.pod_security == pod_security_policy(merge_policies([]))
