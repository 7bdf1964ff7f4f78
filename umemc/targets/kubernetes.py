"""`umemc build STACK --target kubernetes`: the same plan as Kubernetes objects, written as YAML text by
umemc.targets.yamltext (every string plain only where a YAML reader takes it back as that string, else quoted;
tests/test_yamltext.py reads every manifest back with PyYAML). Plain manifests, one file per model plus the
shared objects and a kustomization.yaml, so `kubectl apply -k DIR/kubernetes` or a kustomize overlay
takes them as they are.

What maps to what (docs/KUBERNETES.md):
- a hot model: a Deployment (replicas 1; strategy Recreate: two copies would double its memory) on the node
  the placement chose, requests.memory = its estimate, limits.memory = its hard quota (the kubelet's
  cgroup is the kernel limit umemc sets locally), a PriorityClass from its priority, probes from its health
  URL, a Service on its port, a PodDisruptionBudget;
- a cold model: one Deployment per variant (replicas 0): the nodes it may start on that share a platform
  and an image, with their image, GPU resource, environment and limits; one Service selects whichever runs;
- GPUs: one device of the node's plugin (amd.com/gpu, nvidia.com/gpu) per GPU model, as placed
  (nodes.NAME.gpu_devices);
- environment: umemc's own variables and the stack's `public_env` in a ConfigMap; every other `env` value
  in a Secret that umemc references and never writes (secrets/README.md says how to create it);
- the gateway: an OpenAI-compatible router (LiteLLM proxy) for the models that speak OpenAI, always behind
  a master key from a Secret, with a NetworkPolicy that lets only the router reach the models;
- pods run as non-root with a RuntimeDefault seccomp profile and no capabilities, the namespace enforces
  the restricted Pod Security Standard, model files come from read-only PersistentVolumeClaims;
- host settings (sysctl, kernel arguments) cannot be set from a manifest without a privileged pod:
  node-prep/NODE/ holds each node's files and README.md says how to apply them.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from ..budget.placement import ColdStarts
from ..budget.placement import Need as PlaceNeed
from ..budget.plan import ModelPlan, Plan, held_on_paper, policy_budget
from ..catalog.runtimes import GPU_RESOURCE, holds_gpu_device
from ..chars import kube_name
from ..compile.bundle import Bundle, Program, compile_bundle
from ..compile.launchers import health_path
from ..errors import UsageError
from ..runtime.wrap import STATE_PLACEHOLDER
from ..stack.resolve import ResolvedPlatform
from ..units import GiB
from .yamltext import dump_all

# The runtime's official image per platform kind, pinned to one llama.cpp build (a floating tag would
# change under a running cluster). nvidia-unified machines (DGX Spark, Jetson) are arm64, and upstream's
# CUDA images are amd64 only: those need `image` in the stack. Other runtimes need `image` too. The
# llama.cpp images' entrypoint is llama-server itself: only its arguments are given.
LLAMA_CPP_BUILD = "b9426"
DEFAULT_IMAGES = {
    ("llama-server", "cpu"): f"ghcr.io/ggml-org/llama.cpp:server-{LLAMA_CPP_BUILD}",
    ("llama-server", "amd-apu"): f"ghcr.io/ggml-org/llama.cpp:server-vulkan-{LLAMA_CPP_BUILD}",
    ("llama-server", "nvidia-discrete"): f"ghcr.io/ggml-org/llama.cpp:server-cuda-{LLAMA_CPP_BUILD}",
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


OVERLAY = "keda/"  # the KEDA overlay's files in render_items(); written beside the base (OVERLAY_DIR)
OVERLAY_DIR = "kubernetes-keda"  # beside kubernetes/, not in it: kustomize refuses an overlay inside its own base


def render(plan: Plan) -> dict[str, str]:
    """{path under the output directory: text}: the manifests in kubernetes/, the KEDA overlay beside them."""
    return dict(
        sorted(
            (f"{OVERLAY_DIR}/{rel[len(OVERLAY) :]}" if rel.startswith(OVERLAY) else f"kubernetes/{rel}", text)
            for rel, text in render_items(plan)
        )
    )


def render_items(plan: Plan) -> Iterator[tuple[str, str]]:
    """(relative path under kubernetes/, text) of each file, each model's as soon as it is made."""
    _AFFINITY.clear()
    _VARIANTS.clear()
    header = f"# generated by umemc from {plan.path.name} — do not edit\n"
    ns = _dns(plan.name)
    nodes = _nodes(plan)
    bundles = {n: _compile(node.plan) for n, node in nodes.items()}
    prios = sorted({m.priority for m in plan.models.values()})
    resources = ["namespace.yaml", "priorityclasses.yaml"]
    yield "namespace.yaml", header + dump_all([_namespace(ns)])
    yield (
        "priorityclasses.yaml",
        header + dump_all([_priority_class(ns, p) for p in prios] + [_gateway_class(ns, prios)]),
    )
    routes: list[Route] = []
    secrets: dict[str, list[str]] = {}  # Secret name -> the keys it must hold
    storage: dict[str, dict[str, int]] = {}  # directory of model files -> each file in it -> its bytes
    taken = {_dns(n) for n in plan.models} | {"umemc-gateway"}  # every model's own name, and the router's
    scaled: list[tuple[ModelPlan, Target]] = []  # cold models a request scales from zero (the keda/ overlay)
    for name, m in plan.models.items():
        targets = _targets(plan, name, m, nodes, bundles)
        if not targets:  # a hot model that fits nowhere is not emitted: `check` says why
            continue
        targets = _unique(targets, name, taken)
        if not m.hot and _prefix(m):
            scaled.append((m, targets[0]))
        resources.append(f"models/{name}.yaml")
        yield resources[-1], header + dump_all(_model_objects(plan, m, targets, secrets, storage))
        port = targets[0].program.port
        if port is not None and m.model.spec.runtime in OPENAI_RUNTIMES:
            prefix = _prefix(m)
            routes += [Route(alias, _dns(name), port, prefix, not m.hot) for alias in (name, *m.model.spec.aliases)]
    last = {"gateway.yaml": _gateway(plan, ns, routes, prios), "networkpolicy.yaml": _network_policies(plan, ns)}
    if storage:
        last["storage.yaml"] = [_claim(ns, d, sum(files.values())) for d, files in sorted(storage.items())]
    for path, docs in last.items():
        resources.append(path)
        yield path, header + dump_all(docs)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": resources,
    }
    files = {"kustomization.yaml": dump_all([kustomization])}
    files |= _keda(plan, ns, routes, scaled)
    files |= _secrets_readme(plan, ns, secrets)
    files |= _node_prep(plan, nodes, bundles)
    for path, text in files.items():
        yield path, (header + text if path.endswith(".yaml") else text)


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


def not_scaled(plan: Plan) -> list[str]:
    """A warning at each cold model a request cannot start in a cluster: KEDA's HTTP add-on routes a request to a
    model by a path its server serves under, which only llama-server can be told (--api-prefix)."""
    ns = _dns(plan.name)
    return [
        plan.source.warning(
            ("models", name, "mode"),
            f"a cold {m.model.spec.runtime} model does not start on a request in a cluster (KEDA's HTTP add-on "
            f"routes by a path prefix its server would serve under, and {m.model.spec.runtime} takes none): it "
            f"stays at 0 replicas until `kubectl scale deployment/{_dns(name)} --replicas 1 -n {ns}`, or make it "
            "hot",
        )
        for name, m in plan.models.items()
        if not m.hot and not _prefix(m)
    ]


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
        return [Target(_dns(name), (nodes[home],), m, bundles[home].programs[name])]
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


def _image(plan: Plan, m: ModelPlan, node: Node) -> str:
    """The model's own image, else its node's for the runtime, else the official one (pinned). A model's own image
    on a node that names another for its runtime is refused (another architecture or driver)."""
    spec, at, kind = m.model.spec, ("models", m.name), node.plan.platform.kind
    given: list[tuple[str, tuple[str, ...]]] = [(spec.image, at + ("image",))] if spec.image else []
    if spec.runtime in node.images:
        given.append((node.images[spec.runtime], ("nodes", node.name, "images", spec.runtime)))
    if spec.image and spec.runtime in node.images and node.images[spec.runtime] != spec.image:
        raise plan.source.error(
            at + ("image",),
            f"{spec.image!r} would run on node {node.name}, which names its own {spec.runtime} image "
            f"({node.images[spec.runtime]!r}, nodes.{node.name}.images: another architecture or driver)",
            f"pin models.{m.name} to the nodes its image is for (nodes = [...]), or remove its image to use each "
            "node's",
        )
    for chosen, where in given[:1]:
        tag = _tag(chosen)
        if "@" not in chosen and (tag in FLOATING or not any(c.isdigit() for c in tag)):
            raise plan.source.error(
                where,
                f"{chosen!r} has no fixed version: a floating tag changes under a running cluster",
                "pin a version tag (one with a version number, e.g. server-cuda-b6100) or a digest (image@sha256:…)",
            )
        return chosen
    image = DEFAULT_IMAGES.get((spec.runtime, kind))
    if image is None:
        arm = (
            " (DGX Spark and Jetson are arm64, and upstream's CUDA images are amd64 only: build one from llama.cpp's "
            ".devops/cuda.Dockerfile)"
            if kind in ARM64_KINDS and spec.runtime == "llama-server"
            else ""
        )
        raise plan.source.error(
            at,
            f'image is required for --target kubernetes: runtime = "{spec.runtime}" on kind = "{kind}" has no '
            f"official image to default to{arm}",
            f'give image = "registry/name:version", or the node\'s nodes.{node.name}.images.{spec.runtime}'
            if plan.nodes
            else 'give image = "registry/name:version"',
            what="table",
        )
    return image


def _tag(image: str) -> str:
    """The tag of `registry/name:tag[@sha256:…]` (a port in the registry's host is not one, nor the digest);
    '' when there is none."""
    return image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]


def _version_label(image: str) -> str | None:
    """app.kubernetes.io/version from an image's tag: a label value (63 characters of [A-Za-z0-9._-], starting
    and ending alphanumeric), or none where the tag cannot be one."""
    tag = re.sub(r"[^A-Za-z0-9._-]", "", _tag(image))[:63].strip("._-")
    return tag or None


def _model_objects(
    plan: Plan, m: ModelPlan, targets: list[Target], secrets: dict[str, list[str]], storage: dict[str, dict[str, int]]
) -> list[dict[str, Any]]:
    ns, name, spec = _dns(plan.name), _dns(m.name), m.model.spec
    if not DNS_LABEL.fullmatch(name):
        raise plan.source.error(("models", m.name), f"{name!r} is not a Kubernetes object name", what="key")
    out: list[dict[str, Any]] = []
    secret_keys = [k for k in spec.env if k not in spec.public_env]
    if secret_keys:
        secrets[f"{name}-secret"] = secret_keys
    for t in targets:
        out += _deployment(plan, m, t, secret_keys, storage)
    port = targets[0].program.port
    if port is not None:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "labels": _labels(ns, name, "model")},
                "spec": {
                    "selector": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": ns},
                    "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
                },
            }
        )
    if m.hot:
        out.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "labels": _labels(ns, name, "model")},
                "spec": {
                    "minAvailable": 1,
                    "selector": {"matchLabels": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": ns}},
                },
            }
        )
    return out


def _deployment(
    plan: Plan, m: ModelPlan, t: Target, secret_keys: list[str], storage: dict[str, dict[str, int]]
) -> list[dict[str, Any]]:
    ns, name, spec, kind = _dns(plan.name), _dns(m.name), m.model.spec, t.node.plan.platform.kind
    image = _image(plan, t.plan, t.node)
    version = _version_label(image)
    labels = _labels(ns, name, "model", version)
    # how it is reached (networkpolicy.yaml): through the router, or (a runtime it does not route) its own Service
    labels["umemc.io/reached-by"] = "gateway" if spec.runtime in OPENAI_RUNTIMES else "service"
    select = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": ns}
    if t.name != name:  # one Deployment per node of a cold model
        labels["umemc.io/node"] = t.node.name
        select["umemc.io/node"] = t.node.name
    env = dict(t.program.env)
    plain = {k: v for k, v in env.items() if k not in secret_keys}
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{t.name}-env", "labels": labels},
        "data": plain,
    }
    env_from: list[dict[str, Any]] = [{"configMapRef": {"name": f"{t.name}-env"}}]
    if secret_keys:
        env_from.append({"secretRef": {"name": f"{name}-secret", "optional": False}})
    argv = [a.replace(STATE_PLACEHOLDER, POD_STATE) for a in t.program.argv]
    if _prefix(m):
        argv += ["--api-prefix", _prefix(m)]
    container: dict[str, Any] = {"name": name, "image": image}
    if spec.runtime == "llama-server" and spec.bin is None:
        # llama.cpp's server images keep llama-server at /app/llama-server, off PATH, as their entrypoint (and so
        # do images built alike): arguments only; `bin` names the program in an image made otherwise
        container["args"] = argv[1:]
    else:
        container["command"] = argv[:1]
        container["args"] = argv[1:]
    if spec.cwd is not None and PurePosixPath(spec.cwd).is_absolute():
        container["workingDir"] = spec.cwd  # as the stack names it; a relative one was this machine's
    if t.program.port is not None:
        container["ports"] = [{"name": "http", "containerPort": t.program.port, "protocol": "TCP"}]
    container["envFrom"] = env_from
    limits: dict[str, Any] = {"memory": str(t.plan.quota_hard)}
    requests: dict[str, Any] = {"memory": str(t.plan.quota_soft)}
    if holds_gpu_device(spec.runtime, kind, spec.gpu):
        limits[GPU_RESOURCE[kind]] = 1  # an extended resource: request = limit
        requests[GPU_RESOURCE[kind]] = 1
    container["resources"] = {"requests": requests, "limits": limits}
    container |= _probes(t.plan, t.program, _prefix(m))
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": spec.runtime in READ_ONLY_ROOT,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts, volumes = _volumes(t.plan, storage)
    container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"priorityClassName": _pc_name(ns, m.priority), "securityContext": _pod_security(kind)}
    affinity = _affinity(t.nodes, plan)
    if affinity:
        pod["affinity"] = affinity
    pod["automountServiceAccountToken"] = False
    pod["containers"] = [container]
    pod["volumes"] = volumes
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": t.name,
            "labels": labels,
            "annotations": {
                "umemc.io/mode": spec.mode,
                "umemc.io/estimate-bytes": str(t.plan.quota_soft),
                "umemc.io/hard-quota-bytes": str(t.plan.quota_hard),
                "umemc.io/gpu-window-bytes": str(t.plan.gpu_quota_hard),
                "umemc.io/node": ",".join(n.name for n in t.nodes) if plan.nodes else "",
            },
        },
        "spec": {
            "replicas": 1 if m.hot else 0,
            "strategy": {"type": "Recreate"},
            "progressDeadlineSeconds": STARTUP_S + 300,  # above the startup probe's budget
            "selector": {"matchLabels": select},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    return [config, deployment]


def _pod_security(kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": USER,
        "runAsGroup": USER,
        "fsGroup": USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if kind == "amd-apu":  # /dev/dri and /dev/kfd belong to video and render (add render's id in an overlay)
        out["supplementalGroups"] = [VIDEO_GID]
    return out


def _probes(m: ModelPlan, program: Program, prefix: str = "") -> dict[str, Any]:
    if program.port is None:
        return {}
    path = health_path(m)
    path = prefix + path if path else path
    check: dict[str, Any] = {"httpGet": {"path": path, "port": "http"}} if path else {"tcpSocket": {"port": "http"}}
    return {
        "startupProbe": {**check, "periodSeconds": 10, "failureThreshold": STARTUP_S // 10},
        "readinessProbe": {**check, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def _volumes(m: ModelPlan, storage: dict[str, dict[str, int]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A writable /tmp and state directory (emptyDir: the root filesystem may be read-only), and the model
    files' directories from read-only PersistentVolumeClaims mounted at the path the stack names. `storage`
    gets each file once, by its size (every variant of a cold model mounts the same files)."""
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "umemc-state", "mountPath": POD_STATE},
    ]
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}, {"name": "umemc-state", "emptyDir": {}}]
    files = _file_bytes(m)
    for path, size in files.items():
        storage.setdefault(str(PurePosixPath(path).parent), {})[path] = size
    for d in sorted({str(PurePosixPath(p).parent) for p in files}):
        claim = _claim_name(d)
        volume = f"files-{len(volumes) - 2}"
        mounts.append({"name": volume, "mountPath": d, "readOnly": True})
        volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    return mounts, volumes


def _file_bytes(m: ModelPlan) -> dict[str, int]:
    """The model's files and their sizes: from the disk where they are, else from the estimate (the weights as
    the file holds them: not the repacked copy llama.cpp makes at load, and the projector apart)."""
    out: dict[str, int] = {}
    parts = {p.name: p.bytes for p in m.estimate.weights.parts}
    projector = parts.get("projector", 0)
    for path, guess in (
        (m.model.model_path, m.estimate.weights.bytes - parts.get("repacked copy", 0) - projector),
        (m.model.mmproj_path, projector),
    ):
        if path is None:
            continue
        try:
            out[str(path)] = os.path.getsize(path)
        except OSError:
            out[str(path)] = guess
    return out


def _claim_name(directory: str) -> str:
    """models-<the directory as a DNS label>-<8 hex digits of the exact path>: /srv/models -> models-srv-models-
    1a2b3c4d. The digest keeps apart directories the label alone would merge (a cut at the length limit,
    /srv/Models and /srv/models, /srv/a_b and /srv/a-b)."""
    slug = re.sub(r"[^a-z0-9]+", "-", directory.lower()).strip("-")[:40].strip("-") or "root"
    return f"models-{slug}-{hashlib.sha256(directory.encode()).hexdigest()[:8]}"


def _claim(ns: str, directory: str, size: int) -> dict[str, Any]:
    gib = max(1, math.ceil(size * 1.1 / GiB))  # the weights the stack counts there, and a tenth more
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": _claim_name(directory),
            "labels": _labels(ns, "models", "storage"),
            "annotations": {"umemc.io/mount-path": directory},
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],  # every node's pods read the same files
            "resources": {"requests": {"storage": f"{gib}Gi"}},
        },
    }


def _router_config(routes: list[Route], *, through_keda: bool = False) -> str:
    """LiteLLM's config: each name to its model's Service, or (through_keda: the keda/ overlay) a cold model's
    to KEDA's interceptor, which starts it on the request and holds the request until it answers."""

    def base(r: Route) -> str:
        if through_keda and r.cold and r.prefix:
            return f"http://{KEDA_INTERCEPTOR}.{KEDA_NAMESPACE}:{KEDA_PORT}{r.prefix}/v1"
        return f"http://{r.service}:{r.port}{r.prefix}/v1"

    config: dict[str, Any] = {
        "model_list": [
            {
                "model_name": r.alias,
                "litellm_params": {"model": f"openai/{r.alias}", "api_base": base(r), "api_key": "none"},
            }
            for r in routes
        ],
        # never open to the cluster: the key comes from a Secret umemc does not write (secrets/README.md)
        "general_settings": {"master_key": "os.environ/UMEMC_GATEWAY_TOKEN"},
    }
    return dump_all([config])


def _gateway(plan: Plan, ns: str, routes: list[Route], prios: list[int]) -> list[dict[str, Any]]:
    gw = plan.stack.gateway
    labels = _labels(ns, "umemc-gateway", "gateway", _version_label(GATEWAY_IMAGE))
    select = {"app.kubernetes.io/name": "umemc-gateway", "app.kubernetes.io/instance": ns}
    health = {"httpGet": {"path": "/health/liveliness", "port": "http"}}
    container: dict[str, Any] = {
        "name": "gateway",
        "image": GATEWAY_IMAGE,
        "args": ["--config", "/etc/umemc-gateway/config.yaml", "--port", str(gw.port)],
        "ports": [{"name": "http", "containerPort": gw.port, "protocol": "TCP"}],
        "env": [
            {
                "name": "UMEMC_GATEWAY_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": f"{ns}-gateway-token", "key": "token"}},
            }
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/umemc-gateway", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": GATEWAY_STARTUP_S // 10},
        "readinessProbe": {"httpGet": {"path": "/health/readiness", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10},
        "resources": {"requests": {"memory": str(gw.memory // 2)}, "limits": {"memory": str(gw.memory)}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "umemc-gateway-config", "labels": labels},
            "data": {"config.yaml": _router_config(routes)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "umemc-gateway", "labels": labels},
            "spec": {
                "replicas": 1,
                "progressDeadlineSeconds": GATEWAY_STARTUP_S + 300,
                "selector": {"matchLabels": select},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "priorityClassName": f"umemc-{ns}-gateway",
                        "securityContext": _pod_security("cpu"),
                        "automountServiceAccountToken": False,
                        "containers": [container],
                        "volumes": [
                            {"name": "config", "configMap": {"name": "umemc-gateway-config"}},
                            {"name": "tmp", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "umemc-gateway", "labels": labels},
            "spec": {
                "selector": select,
                "ports": [{"name": "http", "port": gw.port, "targetPort": "http", "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "umemc-gateway", "labels": labels},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": select}},
        },
    ]


def _keda(plan: Plan, ns: str, routes: list[Route], scaled: list[tuple[ModelPlan, Target]]) -> dict[str, str]:
    """kubernetes-keda/: an overlay of the manifests beside them (`kubectl apply -k kubernetes-keda`, KEDA and its
    HTTP add-on installed)
    in which a request for a cold llama-server model starts it: an HTTPScaledObject per model (scale its
    Deployment from 0 to 1 on a request that reaches KEDA's interceptor under /models/NAME/, back to 0 after its
    ttl idle), the router sending those models' requests to the interceptor, and those pods taking connections
    from KEDA's namespace. A cold model of several variants (per-node Deployments) is scaled by its first; the
    scheduler's preemption by PriorityClass makes room for it as for any pod."""
    if not scaled:
        return {}
    gw = plan.stack.gateway
    objects = []
    for m, t in scaled:
        prefix = _prefix(m)
        ttl = m.model.spec.ttl
        objects.append(
            {
                "apiVersion": "http.keda.sh/v1alpha1",
                "kind": "HTTPScaledObject",
                "metadata": {"name": t.name, "labels": _labels(ns, _dns(m.name), "autoscaling")},
                "spec": {
                    "hosts": ["*"],
                    "pathPrefixes": [prefix + "/"],
                    "scaleTargetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": t.name,
                        "service": _dns(m.name),
                        "portName": "http",
                    },
                    "replicas": {"min": 0, "max": 1},
                    "scaledownPeriod": int(ttl) if ttl is not None else KEDA_SCALEDOWN_S,
                    "scalingMetric": {"concurrency": {"targetValue": m.model.max_concurrency}},
                    "timeouts": {"conditionWait": f"{STARTUP_S}s", "responseHeader": f"{int(gw.upstream_timeout)}s"},
                },
            }
        )
    config_patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "umemc-gateway-config"},
        "data": {"config.yaml": _router_config(routes, through_keda=True)},
    }
    names = sorted({_dns(m.name) for m, _ in scaled})
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "umemc-models-from-keda", "labels": _labels(ns, "umemc", "network-policy")},
        "spec": {
            "podSelector": {
                "matchExpressions": [
                    {"key": "app.kubernetes.io/instance", "operator": "In", "values": [ns]},
                    {"key": "app.kubernetes.io/name", "operator": "In", "values": names},
                ]
            },
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": KEDA_NAMESPACE}}}],
                    "ports": [{"port": "http", "protocol": "TCP"}],
                }
            ],
        },
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": ["../kubernetes", "httpscaledobjects.yaml", "networkpolicy.yaml"],
        "patches": [{"path": "gateway-config.yaml"}],
    }
    return {
        "keda/kustomization.yaml": dump_all([kustomization]),
        "keda/httpscaledobjects.yaml": dump_all(objects),
        "keda/gateway-config.yaml": dump_all([config_patch]),
        "keda/networkpolicy.yaml": dump_all([policy]),
    }


def _network_policies(plan: Plan, ns: str) -> list[dict[str, Any]]:
    """Models the router routes answer only the router (and the kubelet's probes, which come from the node); the
    others (ComfyUI, whisper-server, torch, command: the router speaks only OpenAI to llama.cpp servers) answer on
    their http port whoever reaches their Service, as the router does; the router checks each request against
    the master key."""
    models = {
        "app.kubernetes.io/component": "model",
        "app.kubernetes.io/instance": ns,
        "umemc.io/reached-by": "gateway",
    }
    direct = models | {"umemc.io/reached-by": "service"}
    gateway = {"app.kubernetes.io/name": "umemc-gateway", "app.kubernetes.io/instance": ns}
    labels = _labels(ns, "umemc", "network-policy")

    def policy(name: str, pods: dict[str, str], ingress: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": [ingress]},
        }

    return [
        policy("umemc-models-from-gateway", models, {"from": [{"podSelector": {"matchLabels": gateway}}]}),
        policy("umemc-models-by-service", direct, {"ports": [{"port": "http", "protocol": "TCP"}]}),
        policy("umemc-gateway-ingress", gateway, {"ports": [{"port": "http", "protocol": "TCP"}]}),
    ]


def _secrets_readme(plan: Plan, ns: str, secrets: dict[str, list[str]]) -> dict[str, str]:
    """The Secrets the manifests reference and umemc never writes: their keys, and how to create them
    from files kept out of the repository."""
    lines = [
        f"# Secrets of `{plan.name}`",
        "",
        "The manifests reference these Secrets; umemc writes no secret value into a file. Create them in the",
        f"namespace `{ns}` before applying (or with your secret manager: External Secrets, Sealed Secrets):",
        "",
        "```sh",
        f"kubectl create namespace {ns}",
        f'kubectl -n {ns} create secret generic {ns}-gateway-token --from-literal=token="$(openssl rand -hex 32)"',
    ]
    out: dict[str, str] = {}
    for name, keys in sorted(secrets.items()):
        lines.append(f"kubectl -n {ns} create secret generic {name} --from-env-file={name}.env")
        out[f"secrets/{name}.env.example"] = "".join(f"{k}=\n" for k in keys)
    lines += [
        "```",
        "",
        f"`{ns}-gateway-token` is the router's master key: clients send it as `Authorization: Bearer …`.",
        "Each `NAME.env.example` lists a Secret's keys; copy it to `NAME.env` outside the repository, fill in",
        "the values, and create the Secret from it. A model's environment values that are not secret belong in",
        "its `public_env` in the stack file: they go into its ConfigMap instead.",
        "",
    ]
    out["secrets/README.md"] = "\n".join(lines)
    return out


def _node_prep(plan: Plan, nodes: dict[str, Node], bundles: dict[str, Bundle]) -> dict[str, str]:
    """Each node's host settings (the same files a per-node bundle has) and how to apply them; nodes whose files
    are the same (one platform) share one folder, named after the first of them (500 nodes of a few platforms
    are a few folders, not a thousand files)."""
    from .files import kernel, sysctl

    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in nodes:
        keep = sysctl(bundles[name]) | kernel(bundles[name], kubernetes=True)
        groups.setdefault(tuple(sorted(keep.items())), []).append(name)
    out: dict[str, str] = {}
    lines = [
        f"# Preparing the nodes of `{plan.name}`",
        "",
        "The kubelet enforces each model's memory limit with the node's memory cgroup. What a manifest cannot",
        "set without a privileged pod is the host: the VM tunables and, on AMD APUs, the GTT limit (a kernel",
        "argument). Apply them once per node, as root, before the models are scheduled:",
        "",
    ]
    for files, names in groups.items():
        first = names[0]
        out |= {f"node-prep/{first}/{k}": v for k, v in files}
        p = nodes[first].plan.platform
        others = f" and {len(names) - 1} more node(s) with the same settings" if len(names) > 1 else ""
        lines += [f"## {first}{others} ({p.preset or p.kind}, {p.kind})", ""]
        if others:
            lines += [f"On each of: {', '.join(names)}.", ""]
        lines += [
            "```sh",
            f"sudo install -m 0644 node-prep/{first}/sysctl/90-umemc.conf /etc/sysctl.d/90-umemc.conf",
            "sudo sysctl --system",
            "```",
            "",
            f"Kernel and GPU settings: node-prep/{first}/kernel/README.md. Or, with umemc on the node:",
            f"`umemc build STACK -o DIR` and `sudo umemc apply DIR{_nodes_dir(plan, names)}` "
            "(it also installs a systemd unit that would run the stack outside Kubernetes: leave it disabled).",
            "",
        ]
    out["node-prep/README.md"] = "\n".join(lines)
    return out


def _nodes_dir(plan: Plan, names: list[str]) -> str:
    if not plan.nodes:
        return ""
    return f"/nodes/{names[0]}" if len(names) == 1 else "/nodes/NODE"


# -- a lease in the cluster ---------------------------------------------------------------------------------------
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # Kubernetes' own do-nothing image: a pod that only reserves


@dataclass(frozen=True)
class LeaseAsk:
    """Memory for something outside the stack, held under the scheduler as a model is (umemc lease-pod)."""

    name: str  # the Pod's name (a DNS label)
    holder: str  # who holds it, as a label value (umemc.commands.lease_pod.label_value)
    bytes: int
    priority: int
    ttl_s: float
    node: str | None = None
    gpu_device: bool = False
    holder_said: str | None = None  # the holder as it was given (the Pod's annotation), where it differs


def lease_pod(plan: Plan, ask: LeaseAsk) -> list[dict[str, Any]]:
    """The lease as Kubernetes objects: its PriorityClass (the stack's own for that priority, created by the same
    name where no model has it) and a Pod of the pause image whose memory request and limit are the lease's size,
    at the lease's priority (so the scheduler preempts lower-priority models for it as for a cold model), ended by
    the kubelet after its ttl (activeDeadlineSeconds: a Failed pod holds nothing), on the node asked for."""
    ns = _dns(plan.name)
    nodes = _nodes(plan)
    if ask.node is not None and ask.node not in nodes:
        raise UsageError(f"--node {ask.node}: not a node of this stack (its nodes: {', '.join(nodes)})")
    resources: dict[str, Any] = {"memory": str(ask.bytes)}
    if ask.gpu_device:
        kinds = {nodes[ask.node].plan.platform.kind} if ask.node else {n.plan.platform.kind for n in nodes.values()}
        gpu = sorted({GPU_RESOURCE[k] for k in kinds if k in GPU_RESOURCE})
        if len(gpu) != 1:
            raise UsageError("--gpu-device: give --node, a node with one GPU device plugin (amd-apu, nvidia-*)")
        resources[gpu[0]] = 1  # an extended resource: request = limit
    container = {
        "name": "hold",
        "image": PAUSE_IMAGE,
        "resources": {"requests": {**resources, "cpu": "1m"}, "limits": resources},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    labels = _labels(ns, ask.holder, "lease") | {"umemc.io/lease": _dns(ask.name)}
    pod: dict[str, Any] = {
        "priorityClassName": _pc_name(ns, ask.priority),
        "activeDeadlineSeconds": max(1, math.ceil(ask.ttl_s)),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "securityContext": {k: v for k, v in _pod_security("cpu").items() if k != "fsGroup"},
        "containers": [container],
    }
    affinity = _affinity((nodes[ask.node],), plan) if ask.node else None
    if affinity:
        pod["affinity"] = affinity
    meta = {"name": _dns(ask.name), "namespace": ns, "labels": labels}
    meta["annotations"] = {"umemc.io/holder": ask.holder_said or ask.holder, "umemc.io/lease-bytes": str(ask.bytes)}
    return [_priority_class(ns, ask.priority), {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod}]


def lease_preemptions(plan: Plan, ask: LeaseAsk) -> dict[str, tuple[str, ...] | None]:
    """Per node the lease may use: the models its pod preempts there (empty: it fits beside them), or None where
    it cannot be placed even so; the one eviction policy on paper with GPU devices
    (umemc.budget.placement.ColdStarts)."""
    out: dict[str, tuple[str, ...] | None] = {}
    for name, node in _nodes(plan).items():
        if ask.node is not None and name != ask.node:
            continue
        p = node.plan
        kind = p.platform.kind
        held = {m.name: int(holds_gpu_device(m.model.spec.runtime, kind, m.model.spec.gpu)) for m in p.models.values()}
        limit = plan.node_devices.get(name) if plan.nodes else None
        free = NO_DEVICE_LIMIT if limit is None else limit - sum(held[m.name] for m in p.models.values() if m.hot)
        starts = ColdStarts(held_on_paper(p), policy_budget(p), free, held)
        out[name] = starts.victims(PlaceNeed(ask.bytes, 0, int(ask.gpu_device)), ask.priority)
    return out


NO_DEVICE_LIMIT = 1 << 31
