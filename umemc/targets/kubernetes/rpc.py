"""A model split across nodes (docs/SPLIT.md) in a cluster: each helper node's part is an RPC server
(`ggml-rpc-server`) in a Deployment pinned to that node, with the part's memory as its request and hard quota as its
limit, a Service the main model's llama-server reaches it by (`--rpc NAME-rpc-NODE:PORT,...`), and a NetworkPolicy
that lets only that model's pods in: llama.cpp's RPC protocol has no authentication.

llama.cpp's official images are built without the RPC backend (their Dockerfiles do not pass -DGGML_RPC=ON), so a
split model names its image (`image`, or the nodes' `images.llama-server`): one built with it, whose RPC server is
beside llama-server (`bin`'s directory, else /app as in llama.cpp's images)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from ...budget.plan import ModelPlan, Plan
from ...budget.split import RPC_PROGRAM, Part
from ...catalog.runtimes import GPU_RESOURCE, holds_gpu_device
from .shared import Node, _affinity, _dns, _labels, _pc_name, container_security, rpc_name, rpc_port
from .workloads import _image, _pod_security, _version_label

IMAGE_DIR = "/app"  # where llama.cpp's images keep their programs


def check_images(plan: Plan, m: ModelPlan, nodes: dict[str, Node]) -> None:
    """A split needs an image with llama.cpp's RPC backend on every node it spans: the official ones have none."""
    assert m.split is not None
    spec = m.model.spec
    bare = [p.node for p in m.split.parts if not spec.image and "llama-server" not in nodes[p.node].images]
    if bare:
        raise plan.source.error(
            ("models", m.name, "split"),
            f"a split model's pods need llama.cpp built with its RPC backend (-DGGML_RPC=ON), which the official "
            f"images are not: no image is named for it on {', '.join(bare)}",
            'give image = "registry/llama.cpp:VERSION" (one built with -DGGML_RPC=ON), or the nodes\' '
            "images.llama-server",
        )


def part_objects(plan: Plan, m: ModelPlan, part: Part, node: Node, helper: ModelPlan) -> list[dict[str, Any]]:
    """One helper node's part: its Deployment, Service and NetworkPolicy."""
    ns, name, port = _dns(plan.name), rpc_name(m.name, part.node), rpc_port(part)
    image = _image(plan, m, node)
    labels = _labels(ns, name, "rpc", _version_label(image)) | {"umemc.io/part-of": _dns(m.name)}
    select = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": ns}
    kind = node.plan.platform.kind
    program = (
        str(PurePosixPath(m.model.spec.bin).with_name(RPC_PROGRAM))
        if m.model.spec.bin
        else f"{IMAGE_DIR}/{RPC_PROGRAM}"
    )
    limits: dict[str, Any] = {"memory": str(helper.quota_hard)}
    requests: dict[str, Any] = {"memory": str(helper.quota_soft)}
    if holds_gpu_device("llama-server", kind, m.model.spec.gpu):
        limits[GPU_RESOURCE[kind]] = 1
        requests[GPU_RESOURCE[kind]] = 1
    # no probes: llama.cpp's RPC server serves one client at a time with a listen backlog of one, so once the model
    # is connected a TCP probe times out, and a liveness probe would kill the server under the model; one that exits
    # ends its container (restarted), one that hangs fails the model's requests (its own probes restart it)
    container = {
        "name": "rpc-server",
        "image": image,
        "command": [program],
        "args": ["--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "rpc", "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "securityContext": container_security(read_only=True),
    }
    pod: dict[str, Any] = {"priorityClassName": _pc_name(ns, m.priority), "securityContext": _pod_security(kind)}
    affinity = _affinity((node,), plan)
    if affinity:
        pod["affinity"] = affinity
    pod |= {"automountServiceAccountToken": False, "containers": [container]}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "umemc.io/part-of": m.name,
                "umemc.io/holds": part.holds,
                "umemc.io/estimate-bytes": str(helper.quota_soft),
                "umemc.io/hard-quota-bytes": str(helper.quota_hard),
                "umemc.io/node": node.name,
            },
        },
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": select},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": select, "ports": [{"name": "rpc", "port": port, "targetPort": "rpc", "protocol": "TCP"}]},
    }
    model_pods = {"app.kubernetes.io/name": _dns(m.name), "app.kubernetes.io/instance": ns}
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": select},
            "policyTypes": ["Ingress"],
            # the model's llama-server only (and the kubelet's probes, which come from the node)
            "ingress": [{"from": [{"podSelector": {"matchLabels": model_pods}}], "ports": [{"port": "rpc"}]}],
        },
    }
    return [deployment, service, policy]
