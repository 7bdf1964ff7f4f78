"""The OpenAI-compatible router in front of the models (LiteLLM proxy, behind a master key from a Secret), the
NetworkPolicies that let only it reach them, and the README of the Secrets umemc references but never writes."""

from __future__ import annotations

from typing import Any

from ...budget.plan import Plan
from ..yamltext import dump_all
from .shared import GATEWAY_IMAGE, GATEWAY_STARTUP_S, KEDA_INTERCEPTOR, KEDA_NAMESPACE, KEDA_PORT, Route, _labels
from .workloads import _pod_security, _version_label


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
