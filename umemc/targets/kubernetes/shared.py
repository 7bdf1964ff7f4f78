"""What every part of the Kubernetes target shares: the pinned images and bounds, the nodes and each model's
Deployments (Targets: one per set of nodes that share a platform and an image), names and labels, priority classes
and node affinity."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any

from ...budget.plan import ModelPlan, Plan
from ...budget.split import Part, Split
from ...chars import kube_name
from ...compile.bundle import Bundle, Program, compile_bundle
from ...errors import UsageError
from ...stack.resolved import ResolvedPlatform

# The runtime's official image per platform kind, pinned to one llama.cpp build (a floating tag would
# change under a running cluster). nvidia-unified machines (DGX Spark, Jetson) are arm64, and upstream's
# CUDA images are amd64 only: those need `image` in the stack. Other runtimes need `image` too. The
# llama.cpp images' entrypoint is llama-server itself: only its arguments are given.
LLAMA_CPP_BUILD = "b9426"
DEFAULT_IMAGES = {
    ("llama-server", "cpu"): f"ghcr.io/ggml-org/llama.cpp:server-{LLAMA_CPP_BUILD}",
    ("llama-server", "amd-apu"): f"ghcr.io/ggml-org/llama.cpp:server-vulkan-{LLAMA_CPP_BUILD}",
    ("llama-server", "nvidia-discrete"): f"ghcr.io/ggml-org/llama.cpp:server-cuda-{LLAMA_CPP_BUILD}",
    # vLLM's own OpenAI server image (amd64, CUDA), pinned to the release the vllm launcher spells for; umemc gives
    # it `python3 -m vllm.entrypoints.openai.api_server` and the pinned flags as its command
    ("vllm", "nvidia-discrete"): "vllm/vllm-openai:v0.32.0",
}
ARM64_KINDS = frozenset({"nvidia-unified"})
GATEWAY_IMAGE = "ghcr.io/berriai/litellm:v1.89.4"
OPENAI_RUNTIMES = frozenset({"llama-server", "llama-cpp-python"})  # what the router may send OpenAI requests
READ_ONLY_ROOT = frozenset({"llama-server", "whisper-server"})  # write nothing outside /tmp and the state dir

# KEDA's HTTP add-on as its Helm chart installs it: the interceptor proxy that holds a request while it scales
# the target from zero (docs/KUBERNETES.md)
KEDA_NAMESPACE = "keda"
KEDA_INTERCEPTOR = "keda-add-ons-http-interceptor-proxy"
KEDA_PORT = 8080
KEDA_SCALEDOWN_S = 600  # a cold model without a ttl is scaled back to zero after this long idle
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
STARTUP_S = 900  # a 70B model may take minutes to load from disk: 15 minutes before the kubelet gives up
GATEWAY_STARTUP_S = 300  # LiteLLM took 106 s to answer its health URL on a small machine
POD_STATE = "/var/lib/umemc"  # the pod's own state directory (an emptyDir): llama-server's slot files
USER = 65532  # the conventional non-root uid/gid of distroless images
VIDEO_GID = 44  # owns /dev/dri on Debian, Ubuntu and Fedora; the render group's id differs per distribution
FLOATING = ("", "latest", "nightly", "edge", "main", "master", "stable")  # and any tag without a version number


@dataclass(frozen=True)
class Node:
    name: str
    plan: Plan
    labels: dict[str, str]
    images: dict[str, str]  # container image by runtime on this node (nodes.NAME.images)

    @property
    def selector(self) -> dict[str, str]:
        """How a pod is pinned to it: its labels, else its hostname."""
        return self.labels or {"kubernetes.io/hostname": self.name}


@dataclass(frozen=True)
class Target:
    """One Deployment of a model: where it runs and what it is there."""

    name: str  # the Deployment's name
    nodes: tuple[Node, ...]  # where it may run: one platform, one image (the first names the variant)
    plan: ModelPlan
    program: Program

    @property
    def node(self) -> Node:
        return self.nodes[0]


@dataclass(frozen=True)
class Route:
    """A name the router answers to, and where it sends it."""

    alias: str  # a model's name or one of its aliases
    service: str
    port: int
    prefix: str  # the path the model's server serves under ("" for none)
    cold: bool


def _prefix(m: ModelPlan) -> str:
    """llama-server serves under /models/NAME in a pod (--api-prefix, its health URL included), so one path
    names the model all the way: the router's upstream, KEDA's interceptor route, the probes."""
    return f"/models/{_dns(m.name)}" if m.model.spec.runtime == "llama-server" else ""


def _unique(targets: list[Target], name: str, taken: set[str]) -> list[Target]:
    """A variant's Deployment `MODEL-NODE` may spell another model's name (model `chat` on node `b` against a
    model `chat-b`) or another variant's (`a-b` on `c`, `a` on `b-c`): such a one gets 8 hex digits of its model
    and nodes. A model's own name is its own."""
    out = []
    for t in targets:
        if t.name != _dns(name) and t.name in taken:
            digest = hashlib.sha256(f"{name}/{'/'.join(n.name for n in t.nodes)}".encode()).hexdigest()[:8]
            t = replace(t, name=f"{t.name[:54]}-{digest}")
        taken.add(t.name)
        out.append(t)
    return out


def _nodes(plan: Plan) -> dict[str, Node]:
    if plan.nodes:
        out = {}
        for name, p in plan.nodes.items():
            if p.platform.kind == "apple":
                raise UsageError(
                    f'nodes.{name}: kind = "apple" cannot run models in containers with the GPU (Metal is not '
                    "available to containers): run that node with `umemc build` and `umemc up --node`"
                )
            out[name] = Node(name, p, plan.node_labels[name], plan.node_images[name])
        return out
    if plan.platform.kind == "apple":
        raise UsageError('platform kind = "apple" cannot run models in containers with the GPU: use `umemc up`')
    return {"default": Node("default", plan, {}, {})}


def _compile(p: Plan) -> Bundle:
    # a pod listens on its own address, not loopback; its Python is the image's, not this machine's
    return compile_bundle(p, host="0.0.0.0", python="python", local=False)  # the images' runtimes


def _targets(plan: Plan, name: str, m: ModelPlan, nodes: dict[str, Node], bundles: dict[str, Bundle]) -> list[Target]:
    """A hot model: its home node. A cold model: the nodes it is admissible on, one Deployment per variant
    (nodes of one platform and one image share it: the same quotas, argv and environment), compiled there."""
    if not plan.nodes:
        return [Target(_dns(name), (nodes["default"],), m, bundles["default"].programs[name])]
    assert plan.placement is not None
    if m.hot:
        home = plan.placement.home.get(name)
        if home is None or name in plan.placement.unplaced:
            return []
        program = bundles[home].programs[name]  # its plan there: a split model's part on its main node
        return [Target(_dns(name), (nodes[home],), program.plan, program)]
    admissible = list(plan.placement.cold.get(name, ())) or [plan.placement.home[name]]
    variant_of = _variant_keys(plan, nodes, m.model.spec.runtime)
    groups: dict[tuple[int, str | None], list[str]] = {}
    for node in admissible:  # the platform sets the figures and the environment, the image the argv
        groups.setdefault(variant_of[node], []).append(node)
    out = []
    for members in groups.values():
        variant = plan.variants[name][members[0]]
        program = _compile(replace(plan.nodes[members[0]], models={name: variant})).programs[name]
        label = _dns(name) if len(groups) == 1 else f"{_dns(name)}-{_dns(members[0])}"
        out.append(Target(label, tuple(nodes[n] for n in members), variant, program))
    return out


def _variant_keys(plan: Plan, nodes: dict[str, Node], runtime: str) -> dict[str, tuple[int, str | None]]:
    """Per node, what sets a cold model's variant there: its platform (as a number: hashing the platform's
    dataclass for every node of every cold model was a quarter of a 500-node render) and its image for the
    runtime. Made once per plan and runtime."""
    cached = _VARIANTS.get(runtime)
    if cached is not None and cached[0] is plan:
        return cached[1]
    numbers: dict[ResolvedPlatform, int] = {}
    keys = {
        n: (numbers.setdefault(plan.nodes[n].platform, len(numbers)), node.images.get(runtime))
        for n, node in nodes.items()
    }
    _VARIANTS[runtime] = (plan, keys)
    return keys


_VARIANTS: dict[str, tuple[Plan, dict[str, tuple[int, str | None]]]] = {}  # by runtime, for the plan rendered


def _labels(ns: str, name: str, component: str, version: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": ns,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": ns,
        "app.kubernetes.io/managed-by": "umemc",
    }
    if version:
        out["app.kubernetes.io/version"] = version
    return out


def _dns(name: str) -> str:
    """A stack, model or node name as a Kubernetes object name (umemc.chars.kube_name)."""
    return kube_name(name)


def _namespace(ns: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/part-of": ns, "app.kubernetes.io/managed-by": "umemc"}
    for mode in ("enforce", "audit", "warn"):  # the restricted Pod Security Standard
        labels[f"pod-security.kubernetes.io/{mode}"] = "restricted"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}


def _priority_class(ns: str, priority: int, name: str | None = None, what: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name or _pc_name(ns, priority), "labels": _labels(ns, "umemc", "priority")},
        "value": priority,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": what or f"umemc stack {ns}: models of priority {priority} (higher survives eviction longer)",
    }


def _gateway_class(ns: str, prios: list[int]) -> dict[str, Any]:
    value = max(prios, default=0) + 1
    return _priority_class(ns, value, f"umemc-{ns}-gateway", f"umemc stack {ns}: the router, above every model")


def container_security(*, read_only: bool) -> dict[str, Any]:
    """A container's security context: no privilege escalation, no capabilities; a read-only root where the program
    writes nothing outside its volumes."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only, "capabilities": {"drop": ["ALL"]}}


def _pc_name(ns: str, priority: int) -> str:
    return f"umemc-{ns}-p{priority}"


def _affinity(nodes: tuple[Node, ...], plan: Plan) -> dict[str, Any] | None:
    """Any of the nodes (one term each: terms are ORed), each by its labels or its hostname; nodes each found by
    one label of the same key are one term (key In [each node's value]), as the scheduler reads either. The same
    nodes give the same object (a cold model's variants on a 500-node cluster share many)."""
    if not plan.nodes:
        return None
    key = tuple(node.name for node in nodes)
    made = _AFFINITY.get(key)
    if made is None or made[0] is not plan:
        made = _AFFINITY[key] = (plan, _node_affinity(nodes))
    return made[1]


_AFFINITY: dict[tuple[str, ...], tuple[Plan, dict[str, Any]]] = {}  # by node names, for the plan being rendered


def _node_affinity(nodes: tuple[Node, ...]) -> dict[str, Any]:
    selectors = [node.selector for node in nodes]
    keys = {k for labels in selectors for k in labels}
    if len(nodes) > 1 and len(keys) == 1 and all(len(labels) == 1 for labels in selectors):
        [key] = keys
        values = [labels[key] for labels in selectors]
        terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]
    else:
        terms = [
            {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]}
            for labels in selectors
        ]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def rpc_name(model: str, node: str) -> str:
    """The Deployment and Service of a model's part on a node: MODEL-rpc-NODE, or cut to fit a DNS label with a
    short hash of the whole (a Service name is a DNS label)."""
    name = f"{_dns(model)}-rpc-{_dns(node)}"
    if DNS_LABEL.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-')}-{digest}"


def rpc_endpoints(split: Split) -> str:
    """The --rpc value in a cluster: each helper's Service, in the split's order."""
    return ",".join(f"{rpc_name(split.model, p.node)}:{rpc_port(p)}" for p in split.helpers)


def rpc_port(p: Part) -> int:
    assert p.endpoint is not None
    return int(p.endpoint.rpartition(":")[2])
