"""`umemc build STACK --target kubernetes`: the same plan as Kubernetes objects, written by PyYAML (no
hand-made YAML: every value is escaped by the library). Plain manifests, one file per model plus the
shared objects and a kustomization.yaml, so `kubectl apply -k DIR/kubernetes` or a kustomize overlay
takes them as they are.

What maps to what (docs/KUBERNETES.md):
- a model: a Deployment (replicas 1 hot, 0 cold; strategy Recreate: two copies would double its
  memory), requests.memory = its estimate, limits.memory = its hard quota (the kubelet's cgroup is
  the kernel limit umemc sets locally), node affinity from the placement, a PriorityClass from its
  priority, probes from its health URL, a Service on its port, a ConfigMap for its environment and a
  Secret for the variables that look like secrets (never a ConfigMap);
- GPUs: amd.com/gpu or nvidia.com/gpu = 1 where the node's platform needs the device plugin;
- the gateway: an OpenAI-compatible router (LiteLLM proxy) Deployment + Service, routing each model
  name and alias to the model's Service;
- host settings (sysctl, kernel arguments) cannot be set from a manifest without a privileged pod:
  node-prep/NODE/ holds each node's files and README.md says how to apply them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ..budget import ModelPlan, Plan
from ..compile import Bundle, Program, compile_bundle
from ..errors import UsageError
from ..launchers import health_path

# The runtime's official image per platform kind; other runtimes need `image` in the stack. The
# llama.cpp images' entrypoint is llama-server itself: only its arguments are given.
DEFAULT_IMAGES = {
    ("llama-server", "cpu"): "ghcr.io/ggml-org/llama.cpp:server",
    ("llama-server", "amd-apu"): "ghcr.io/ggml-org/llama.cpp:server-vulkan",
    ("llama-server", "nvidia-unified"): "ghcr.io/ggml-org/llama.cpp:server-cuda",
    ("llama-server", "nvidia-discrete"): "ghcr.io/ggml-org/llama.cpp:server-cuda",
}
GATEWAY_IMAGE = "ghcr.io/berriai/litellm:main-stable"
GPU_RESOURCE = {"amd-apu": "amd.com/gpu", "nvidia-unified": "nvidia.com/gpu", "nvidia-discrete": "nvidia.com/gpu"}
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE)", re.IGNORECASE)
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
STARTUP_S = 900  # a 70B model may take minutes to load from disk: 15 minutes before the kubelet gives up


@dataclass(frozen=True)
class Node:
    name: str
    plan: Plan
    labels: dict[str, str]


def dump_all(docs: list[dict[str, Any]]) -> str:
    """YAML documents as PyYAML writes them, without anchors and aliases (a reader of a manifest expects
    every object spelled out, and some tools mishandle aliases)."""
    import yaml

    class Plain(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no type hints
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return str(yaml.dump_all(docs, Dumper=Plain, sort_keys=False, default_flow_style=False, allow_unicode=True))


def render(plan: Plan) -> dict[str, str]:
    """{relative path under kubernetes/: text}."""
    stack = plan.name
    nodes = _nodes(plan)
    objs: dict[str, list[dict[str, Any]]] = {
        "namespace.yaml": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": stack, "labels": _part(stack)}}
        ],
        "priorityclasses.yaml": [_priority_class(stack, p) for p in sorted({m.priority for m in plan.models.values()})],
    }
    seen: dict[str, str] = {}
    for name in plan.models:
        if _dns(name) in seen:
            raise UsageError(
                f"models.{name}: its Kubernetes name {_dns(name)!r} is also models.{seen[_dns(name)]}'s "
                "('_' becomes '-'): rename one"
            )
        seen[_dns(name)] = name
    routes: list[tuple[str, str, int]] = []  # (model name or alias, service, port)
    bundles = {n: _compile(node.plan) for n, node in nodes.items()}
    programs = {n: b.programs for n, b in bundles.items()}
    for name, m in plan.models.items():
        home = plan.node_of(name) or next(iter(nodes))
        node = nodes[home]
        program = programs[home].get(name)
        if program is None:  # a hot model that fits nowhere is not emitted: `check` says why
            continue
        objs[f"models/{name}.yaml"] = _model_objects(plan, m, program, node, nodes)
        if program.port is not None:
            for alias in (name, *m.model.spec.aliases):
                routes.append((alias, _dns(name), program.port))
    objs["gateway.yaml"] = _gateway(plan, routes)
    files = {path: dump_all(docs) for path, docs in objs.items()}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": stack,
        "resources": list(objs),
    }
    files["kustomization.yaml"] = dump_all([kustomization])
    files |= _node_prep(plan, nodes, bundles)
    header = f"# generated by umemc from {plan.path.name} — do not edit\n"
    return {p: (header + t if p.endswith(".yaml") else t) for p, t in sorted(files.items())}


def _nodes(plan: Plan) -> dict[str, Node]:
    if plan.nodes:
        out = {}
        for name, p in plan.nodes.items():
            if p.platform.kind == "apple":
                raise UsageError(
                    f'nodes.{name}: kind = "apple" cannot run models in containers with the GPU (Metal is not '
                    "available to containers): run that node with `umemc build` and `umemc up --node`"
                )
            out[name] = Node(name, p, plan.node_labels[name])
        return out
    if plan.platform.kind == "apple":
        raise UsageError('platform kind = "apple" cannot run models in containers with the GPU: use `umemc up`')
    return {"default": Node("default", plan, {})}


def _compile(p: Plan) -> Bundle:
    # a pod listens on its own address, not loopback; its Python is the image's, not this machine's
    return compile_bundle(p, host="0.0.0.0", python="python")


def _part(stack: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": stack, "app.kubernetes.io/managed-by": "umemc"}


def _dns(name: str) -> str:
    """A model name as a Kubernetes object name (DNS-1123 label: no '_')."""
    return name.replace("_", "-")


def _priority_class(stack: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": _pc_name(stack, priority), "labels": _part(stack)},
        "value": priority,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": f"umemc stack {stack}: models of priority {priority} (higher survives eviction longer)",
    }


def _pc_name(stack: str, priority: int) -> str:
    return f"umemc-{_dns(stack)}-p{priority}"


def _affinity(plan: Plan, name: str, nodes: dict[str, Node]) -> dict[str, Any] | None:
    if not plan.nodes:
        return None
    assert plan.placement is not None
    if plan.models[name].hot:
        targets = [plan.placement.home[name]]
    else:
        targets = [c.node for c in plan.placement.cold.get(name, []) if c.admissible] or [plan.placement.home[name]]
    terms = []
    for n in targets:
        labels = nodes[n].labels or {"kubernetes.io/hostname": n}
        terms.append({"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _model_objects(
    plan: Plan, m: ModelPlan, program: Program, node: Node, nodes: dict[str, Node]
) -> list[dict[str, Any]]:
    stack, name, spec = plan.name, _dns(m.name), m.model.spec
    if not DNS_LABEL.fullmatch(name):
        raise UsageError(f"models.{m.name}: {name!r} is not a Kubernetes object name (DNS-1123 label)")
    kind = node.plan.platform.kind
    image = spec.image or DEFAULT_IMAGES.get((spec.runtime, kind))
    if image is None:
        raise UsageError(
            f'models.{m.name}.image: required for --target kubernetes: runtime = "{spec.runtime}" on kind = "{kind}" '
            "has no official image to default to"
        )
    labels = {"app.kubernetes.io/name": name, **_part(stack)}
    env = dict(program.env)
    secret = {k: v for k, v in env.items() if SECRET_NAME.search(k)}
    plain = {k: v for k, v in env.items() if k not in secret}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-env", "labels": labels},
            "data": plain,
        }
    ]
    env_from: list[dict[str, Any]] = [{"configMapRef": {"name": f"{name}-env"}}]
    if secret:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{name}-secret", "labels": labels},
                "type": "Opaque",
                "stringData": secret,
            }
        )
        env_from.append({"secretRef": {"name": f"{name}-secret"}})
    argv = list(program.argv)
    container: dict[str, Any] = {"name": name, "image": image}
    if spec.image is None and (spec.runtime, kind) in DEFAULT_IMAGES:
        container["args"] = argv[1:]  # the image's entrypoint is the runtime
    else:
        container["command"] = argv[:1]
        container["args"] = argv[1:]
    if program.cwd:
        container["workingDir"] = program.cwd
    if program.port is not None:
        container["ports"] = [{"name": "http", "containerPort": program.port, "protocol": "TCP"}]
    container["envFrom"] = env_from
    limits: dict[str, Any] = {"memory": str(m.quota_hard)}
    requests: dict[str, Any] = {"memory": str(m.quota_soft)}
    gpu = GPU_RESOURCE.get(kind)
    if gpu and spec.runtime != "command":
        limits[gpu] = 1  # an extended resource: request = limit
        requests[gpu] = 1
    container["resources"] = {"requests": requests, "limits": limits}
    container |= _probes(m, program)
    container["securityContext"] = {"allowPrivilegeEscalation": False}
    mounts, volumes = _files(m)
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"priorityClassName": _pc_name(stack, m.priority)}
    affinity = _affinity(plan, m.name, nodes)
    if affinity:
        pod["affinity"] = affinity
    pod["containers"] = [container]
    if volumes:
        pod["volumes"] = volumes
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "umemc.io/mode": spec.mode,
                "umemc.io/estimate-bytes": str(m.quota_soft),
                "umemc.io/hard-quota-bytes": str(m.quota_hard),
                "umemc.io/gpu-window-bytes": str(m.gpu_quota_hard),
                "umemc.io/node": plan.node_of(m.name) or "",
            },
        },
        "spec": {
            "replicas": 1 if m.hot else 0,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": stack}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    out.append(deployment)
    if program.port is not None:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "selector": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": stack},
                    "ports": [{"name": "http", "port": program.port, "targetPort": "http", "protocol": "TCP"}],
                },
            }
        )
    return out


def _probes(m: ModelPlan, program: Program) -> dict[str, Any]:
    if program.port is None:
        return {}
    path = health_path(m)
    check: dict[str, Any] = {"httpGet": {"path": path, "port": "http"}} if path else {"tcpSocket": {"port": "http"}}
    return {
        "startupProbe": {**check, "periodSeconds": 10, "failureThreshold": STARTUP_S // 10},
        "readinessProbe": {**check, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def _files(m: ModelPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The model files' directories, mounted read-only from the node at the same path (the stack names
    them as they are on the machine)."""
    dirs = sorted({str(PurePosixPath(p).parent) for p in (m.model.model_path, m.model.mmproj_path) if p is not None})
    mounts = [{"name": f"files-{i}", "mountPath": d, "readOnly": True} for i, d in enumerate(dirs)]
    volumes = [{"name": f"files-{i}", "hostPath": {"path": d, "type": "Directory"}} for i, d in enumerate(dirs)]
    return mounts, volumes


def _gateway(plan: Plan, routes: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    stack, gw = plan.name, plan.stack.gateway
    labels = {"app.kubernetes.io/name": "gateway", **_part(stack)}
    config: dict[str, Any] = {
        "model_list": [
            {
                "model_name": alias,
                "litellm_params": {
                    "model": f"openai/{alias}",
                    "api_base": f"http://{svc}:{port}/v1",
                    "api_key": "none",
                },
            }
            for alias, svc, port in routes
        ]
    }
    env: list[dict[str, Any]] = []
    if gw.token_env:
        config["general_settings"] = {"master_key": "os.environ/UMEMC_GATEWAY_TOKEN"}
        env.append(
            {
                "name": "UMEMC_GATEWAY_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": f"{_dns(stack)}-gateway-token", "key": "token"}},
            }
        )
    container: dict[str, Any] = {
        "name": "gateway",
        "image": GATEWAY_IMAGE,
        "args": ["--config", "/etc/umemc-gateway/config.yaml", "--port", str(gw.port)],
        "ports": [{"name": "http", "containerPort": gw.port, "protocol": "TCP"}],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/umemc-gateway", "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/health/readiness", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health/liveliness", "port": "http"}, "periodSeconds": 10},
        "resources": {"requests": {"memory": str(gw.memory // 2)}, "limits": {"memory": str(gw.memory)}},
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if env:
        container["env"] = env
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gateway-config", "labels": labels},
            "data": {"config.yaml": dump_all([config])},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "gateway", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "gateway", "app.kubernetes.io/part-of": stack}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": "gateway-config"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "gateway", "labels": labels},
            "spec": {
                "selector": {"app.kubernetes.io/name": "gateway", "app.kubernetes.io/part-of": stack},
                "ports": [{"name": "http", "port": gw.port, "targetPort": "http", "protocol": "TCP"}],
            },
        },
    ]


def _node_prep(plan: Plan, nodes: dict[str, Node], bundles: dict[str, Bundle]) -> dict[str, str]:
    """Each node's host settings (the same files a per-node bundle has) and how to apply them."""
    from .files import kernel, sysctl

    out: dict[str, str] = {}
    lines = [
        f"# Preparing the nodes of `{plan.name}`",
        "",
        "The kubelet enforces each model's memory limit with the node's memory cgroup. What a manifest cannot",
        "set without a privileged pod is the host: the VM tunables and, on AMD APUs, the GTT limit (a kernel",
        "argument). Apply them once per node, as root, before the models are scheduled:",
        "",
    ]
    for name, node in nodes.items():
        keep = sysctl(bundles[name]) | kernel(bundles[name], kubernetes=True)
        out |= {f"node-prep/{name}/{k}": v for k, v in keep.items()}
        p = node.plan.platform
        lines += [
            f"## {name} ({p.preset or p.kind}, {p.kind})",
            "",
            "```sh",
            f"sudo install -m 0644 node-prep/{name}/sysctl/90-umemc.conf /etc/sysctl.d/90-umemc.conf",
            "sudo sysctl --system",
            "```",
            "",
            f"Kernel and GPU settings: node-prep/{name}/kernel/README.md. Or, with umemc on the node:",
            f"`umemc build STACK -o DIR` and `sudo umemc apply DIR{f'/nodes/{name}' if plan.nodes else ''}` "
            "(it also installs a systemd unit that would run the stack outside Kubernetes: leave it disabled).",
            "",
        ]
    out["node-prep/README.md"] = "\n".join(lines)
    return out
