"""The KEDA overlay: each cold model that serves HTTP scaled from zero through KEDA's HTTP add-on (an HTTPScaledObject,
the router sent through its interceptor)."""

from __future__ import annotations

from ...budget.plan import ModelPlan, Plan
from ..yamltext import dump_all
from .gateway import _router_config
from .shared import KEDA_NAMESPACE, KEDA_SCALEDOWN_S, STARTUP_S, Route, Target, _dns, _labels, _prefix


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
