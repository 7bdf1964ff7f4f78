"""`umemc build --target kubernetes`: every manifest validated offline against the official Kubernetes
OpenAPI schemas (the kubernetes-validate package bundles them per release), golden files for the
two-node example, the figures cross-checked with budget.json, secrets never in a ConfigMap, values that
need YAML quoting surviving a round trip, kustomize building the directory where kubectl exists, and
`kubectl apply --dry-run=client` where a cluster answers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from umemc.budget import make_plan
from umemc.commands.build import build_kubernetes
from umemc.stack.resolve import load_stack

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "two-node.toml"
GOLDEN = REPO / "tests" / "golden" / "two-node-kubernetes"
UPDATE = os.environ.get("UMEMC_UPDATE_GOLDEN") == "1"
VERSIONS = ("1.29", "1.31")  # kubernetes-validate carries each release's schemas


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("k8s") / "out"
    build_kubernetes(make_plan(load_stack(EXAMPLE)), out)
    return out


def docs(root: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((root / "kubernetes").rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(str(path.relative_to(root)), d) for d in yaml.safe_load_all(path.read_text())]
    return out


def test_every_manifest_is_valid_against_the_official_schemas(built: Path) -> None:
    import kubernetes_validate

    found = docs(built)
    kinds = sorted({d["kind"] for _, d in found})
    assert kinds == ["ConfigMap", "Deployment", "Namespace", "PriorityClass", "Service"]  # no secret env here
    for version in VERSIONS:
        for path, d in found:
            try:
                kubernetes_validate.validate(d, version, strict=True)  # strict: unknown fields are errors
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path} {d['kind']}/{d['metadata']['name']} against {version}: {exc}")


def test_golden_manifests(built: Path) -> None:
    got = {
        str(p.relative_to(built / "kubernetes")): p.read_text()
        for p in sorted((built / "kubernetes").rglob("*"))
        if p.is_file()
    }
    if UPDATE:
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for rel, text in got.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_text(text)
    want = {str(p.relative_to(GOLDEN)): p.read_text() for p in sorted(GOLDEN.rglob("*")) if p.is_file()}
    assert sorted(got) == sorted(want), "regenerate with UMEMC_UPDATE_GOLDEN=1 python3 dev.py test -k golden"
    for rel in got:
        assert got[rel] == want[rel], f"{rel} differs from {GOLDEN / rel}"


def test_figures_and_placement_match_the_budget(built: Path) -> None:
    budget = json.loads((built / "budget.json").read_text())
    deployments = {d["metadata"]["name"]: d for _, d in docs(built) if d["kind"] == "Deployment"}
    assert sorted(deployments) == ["chat", "code", "embed", "gateway", "image", "vision"]
    for name, m in budget["models"].items():
        d = deployments[name]
        pod = d["spec"]["template"]["spec"]
        res = pod["containers"][0]["resources"]
        assert res["requests"]["memory"] == str(m["quota_soft_bytes"])  # requests = estimate
        assert res["limits"]["memory"] == str(m["quota_hard_bytes"])  # limits = hard quota
        assert d["spec"]["replicas"] == (1 if m["mode"] == "hot" else 0)
        assert d["spec"]["strategy"] == {"type": "Recreate"}
        assert pod["priorityClassName"] == f"umemc-two-node-p{m['priority']}"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "umemc.io/node", "operator": "In", "values": [m["node"]]}]}]
        gpu = {"halo": "amd.com/gpu", "spark": "nvidia.com/gpu"}[m["node"]]
        assert res["limits"][gpu] == res["requests"][gpu] == 1
    classes = {d["metadata"]["name"]: d["value"] for _, d in docs(built) if d["kind"] == "PriorityClass"}
    assert classes == {f"umemc-two-node-p{p}": p for p in (40, 50, 60, 80, 90)}
    chat = deployments["chat"]["spec"]["template"]["spec"]["containers"][0]
    assert chat["image"] == "ghcr.io/ggml-org/llama.cpp:server-vulkan" and "command" not in chat
    assert chat["args"][-4:] == ["--host", "0.0.0.0", "--port", "10001"]  # a pod listens on its own address
    assert chat["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert chat["volumeMounts"] == [{"name": "files-0", "mountPath": "/srv/models", "readOnly": True}]
    image = deployments["image"]["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == "registry.example.com/comfyui:cuda" and image["command"] == ["python3"]  # the image's


def test_gateway_routes_every_name_and_alias_to_its_service(built: Path) -> None:
    config = next(d for _, d in docs(built) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gateway-config")
    routes = yaml.safe_load(config["data"]["config.yaml"])
    assert [(r["model_name"], r["litellm_params"]["api_base"]) for r in routes["model_list"]] == [
        ("chat", "http://chat:10001/v1"),
        ("gpt-4o", "http://chat:10001/v1"),
        ("code", "http://code:10002/v1"),
        ("vision", "http://vision:10003/v1"),
        ("embed", "http://embed:10004/v1"),
        ("text-embedding-3-small", "http://embed:10004/v1"),
        ("image", "http://image:10005/v1"),
    ]
    assert routes["general_settings"] == {"master_key": "os.environ/UMEMC_GATEWAY_TOKEN"}
    gateway = next(d for _, d in docs(built) if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway")
    env = gateway["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {
            "name": "UMEMC_GATEWAY_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "two-node-gateway-token", "key": "token"}},
        }
    ]


STACK = """version = 1
name = "one"
[platform]
preset = "dgx-spark-128"
[models.chat]
runtime = "llama-server"
model = "/srv/m/chat.gguf"
arch = "llama-3-8b"
[models.chat.env]
HF_TOKEN = "*hf: [x] {y} 'q' 0x1F"
LOG_FORMAT = "on"
"""


def test_secrets_go_to_a_secret_and_values_round_trip(write_stack, tmp_path: Path) -> None:
    import kubernetes_validate

    out = tmp_path / "out"
    build_kubernetes(make_plan(load_stack(write_stack(STACK))), out)
    found = {(d["kind"], d["metadata"]["name"]): d for _, d in docs(out)}
    config, secret = found[("ConfigMap", "chat-env")], found[("Secret", "chat-secret")]
    assert secret["stringData"] == {"HF_TOKEN": "*hf: [x] {y} 'q' 0x1F"}  # YAML syntax inside: quoted
    assert "HF_TOKEN" not in config["data"]
    assert config["data"]["LOG_FORMAT"] == "on"  # a YAML 1.1 boolean stays a string
    container = found[("Deployment", "chat")]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": "chat-env"}}, {"secretRef": {"name": "chat-secret"}}]
    assert "affinity" not in found[("Deployment", "chat")]["spec"]["template"]["spec"]  # one machine
    for _, d in docs(out):
        kubernetes_validate.validate(d, VERSIONS[-1], strict=True)


def test_refusals(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(STACK.replace('runtime = "llama-server"', 'runtime = "llama-cpp-python"'))
    assert run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", "--files-later", cwd=tmp_path) == (
        2,
        "",
        'models.chat.image: required for --target kubernetes: runtime = "llama-cpp-python" on kind = '
        '"nvidia-unified" has no official image to default to\n',
    )
    write_stack(STACK.replace('preset = "dgx-spark-128"', 'preset = "apple-silicon-64"'))
    assert run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", "--files-later", cwd=tmp_path) == (
        2,
        "",
        'platform kind = "apple" cannot run models in containers with the GPU: use `umemc up`\n',
    )
    write_stack(
        STACK
        + '[models.chat_2]\nruntime = "llama-server"\nmodel = "/srv/m/c.gguf"\narch = "llama-3-8b"\n'
        + '[models.chat-2]\nruntime = "llama-server"\nmodel = "/srv/m/d.gguf"\narch = "llama-3-8b"\n'
    )
    assert run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", "--files-later", cwd=tmp_path) == (
        2,
        "",
        "models.chat-2: its Kubernetes name 'chat-2' is also models.chat_2's ('_' becomes '-'): rename one\n",
    )
    assert not (tmp_path / "out").exists()


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kustomize_builds_the_directory(built: Path) -> None:
    out = subprocess.run([KUBECTL, "kustomize", str(built / "kubernetes")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rendered = list(yaml.safe_load_all(out.stdout))
    namespaced = [d for d in rendered if d["kind"] not in ("Namespace", "PriorityClass")]
    assert namespaced and all(d["metadata"]["namespace"] == "two-node" for d in namespaced)


def _cluster_answers() -> bool:
    if KUBECTL is None:
        return False
    probe = subprocess.run([KUBECTL, "version", "--request-timeout=3s"], capture_output=True, text=True)
    return probe.returncode == 0


@pytest.mark.skipif(
    not _cluster_answers(), reason="no Kubernetes API server answers kubectl (client dry-run needs one)"
)
def test_kubectl_client_dry_run(built: Path) -> None:
    out = subprocess.run(
        [KUBECTL, "apply", "--dry-run=client", "-k", str(built / "kubernetes")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_build_cli_writes_kubernetes_and_the_budget(run_cli, tmp_path: Path) -> None:
    code, out, _ = run_cli(
        "build", str(EXAMPLE), "--target", "kubernetes", "-o", str(tmp_path / "o"), "--files-later", cwd=tmp_path
    )
    assert code == 0
    assert (tmp_path / "o/kubernetes/kustomization.yaml").exists() and (tmp_path / "o/budget.json").exists()
    assert "kubernetes/models/chat.yaml" in out
    for path in (tmp_path / "o/kubernetes").rglob("*.yaml"):  # this machine's interpreter is not the image's
        assert sys.executable not in path.read_text(), path


def test_node_prep_is_for_the_kubelet_not_for_umemc_up(tmp_path: Path, run_cli) -> None:
    """The node-prep files of a Kubernetes build speak of the kubelet: no `umemc up` checks, no systemd unit
    that would run the stack beside Kubernetes; and a build needs no model files here."""
    code, _, err = run_cli("build", str(EXAMPLE), "--target", "kubernetes", "-o", str(tmp_path / "k"))
    assert code == 0, err
    readmes = sorted((tmp_path / "k/kubernetes/node-prep").glob("*/kernel/README.md"))
    assert len(readmes) == 2
    for readme in readmes:
        text = readme.read_text()
        assert "umemc up" not in text and "systemd" not in text, readme
        assert "The kubelet runs this node's models" in text
