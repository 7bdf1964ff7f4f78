"""A model's objects: its Deployments (image, resources, GPU device, probes, security context, volumes), its Service
and PodDisruptionBudget, and the read-only PersistentVolumeClaims of its model files."""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import PurePosixPath
from typing import Any

from ...budget.plan import ModelPlan, Plan
from ...catalog.runtimes import GPU_RESOURCE, holds_gpu_device
from ...compile.bundle import Program
from ...compile.launchers import health_path
from ...runtime.wrap import STATE_PLACEHOLDER
from ...units import GiB
from .shared import (
    ARM64_KINDS,
    DEFAULT_IMAGES,
    DNS_LABEL,
    FLOATING,
    OPENAI_RUNTIMES,
    POD_STATE,
    READ_ONLY_ROOT,
    STARTUP_S,
    USER,
    VIDEO_GID,
    Node,
    Target,
    _affinity,
    _dns,
    _labels,
    _pc_name,
    _prefix,
    container_security,
    rpc_endpoints,
)


def _image(plan: Plan, m: ModelPlan, node: Node) -> str:
    """The model's own image, else its node's for the runtime, else the official one (pinned). A model's own image
    on a node that names another for its runtime is refused (another architecture or driver)."""
    spec, at, kind = m.model.spec, ("models", m.name), node.plan.platform.kind
    if spec.runtime == "mlx":
        raise plan.source.error(
            at + ("runtime",),
            'runtime = "mlx" cannot run in a container: MLX serves from Apple silicon\'s GPU (Metal), which no '
            "container reaches",
            'run it with `umemc up` on the Mac, or use runtime = "vllm" or "llama-server" on this cluster',
        )
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
    if m.split is not None:  # its helpers by their Services (the nodes' addresses are umemc up's)
        argv[argv.index("--rpc") + 1] = rpc_endpoints(m.split)
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
    container["securityContext"] = container_security(read_only=spec.runtime in READ_ONLY_ROOT)
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
