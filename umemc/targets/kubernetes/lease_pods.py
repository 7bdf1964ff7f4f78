"""A lease in the cluster (`umemc lease-pod`): a pod of Kubernetes' pause image that reserves the memory, where the one
eviction policy on paper (with GPU devices) says it may go and what it preempts there."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...budget.placement import ColdStarts
from ...budget.placement import Need as PlaceNeed
from ...budget.plan import Plan, held_on_paper, policy_budget
from ...catalog.runtimes import GPU_RESOURCE, holds_gpu_device
from ...errors import UsageError
from .shared import _affinity, _dns, _labels, _nodes, _pc_name, _priority_class, container_security
from .workloads import _pod_security

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
        "securityContext": container_security(read_only=True),
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
