"""`umemc build --target kubernetes`: every manifest validated offline against the official Kubernetes
OpenAPI schemas (the kubernetes-validate package bundles them per release), golden files for the
two-node example, the figures cross-checked with budget.json, secrets never in a ConfigMap, values that
need YAML quoting surviving a round trip, kustomize building the directory where kubectl exists, and
`kubectl apply --dry-run=client` where a cluster answers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from umemc.budget.plan import make_plan
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


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects a real kustomize (kubectl's, v5) builds from a kustomization directory; no cluster needed."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (its kustomize builds the overlays)")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def docs(root: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted([*(root / "kubernetes").rglob("*.yaml"), *(root / "kubernetes-keda").rglob("*.yaml")]):
        if path.name == "kustomization.yaml":
            continue
        out += [(str(path.relative_to(root)), d) for d in yaml.safe_load_all(path.read_text())]
    return out


def test_every_manifest_is_valid_against_the_official_schemas(built: Path) -> None:
    import kubernetes_validate

    found = docs(built)
    kinds = sorted({d["kind"] for _, d in found})
    assert kinds == [  # no Secret: umemc references Secrets and never writes one
        "ConfigMap",
        "Deployment",
        "Namespace",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "PriorityClass",
        "Service",
    ]
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
    assert sorted(deployments) == ["chat", "code", "embed", "image", "umemc-gateway", "vision"]
    for name, m in budget["models"].items():
        d = deployments[name]
        pod = d["spec"]["template"]["spec"]
        res = pod["containers"][0]["resources"]
        assert res["requests"]["memory"] == str(m["quota_soft_bytes"])  # requests = estimate
        assert res["limits"]["memory"] == str(m["quota_hard_bytes"])  # limits = hard quota
        assert d["spec"]["replicas"] == (1 if m["mode"] == "hot" else 0)
        assert d["spec"]["strategy"] == {"type": "Recreate"}
        assert d["spec"]["progressDeadlineSeconds"] == 1200  # above the startup probe's 90 x 10 s
        assert pod["priorityClassName"] == f"umemc-two-node-p{m['priority']}"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "umemc.io/node", "operator": "In", "values": [m["node"]]}]}]
        gpu = {"halo": "amd.com/gpu", "spark": "nvidia.com/gpu"}[m["node"]]
        assert res["limits"][gpu] == res["requests"][gpu] == 1
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "workingDir" not in pod["containers"][0] or name == "image"  # only an absolute cwd of the stack's
    classes = {d["metadata"]["name"]: d["value"] for _, d in docs(built) if d["kind"] == "PriorityClass"}
    assert classes == {**{f"umemc-two-node-p{p}": p for p in (40, 50, 60, 80, 90)}, "umemc-two-node-gateway": 91}
    chat = deployments["chat"]["spec"]["template"]["spec"]["containers"][0]
    assert chat["image"] == "ghcr.io/ggml-org/llama.cpp:server-vulkan-b9426" and "command" not in chat  # pinned
    # a pod listens on its own address, and llama-server serves under /models/NAME (its health URL too)
    # (its CPU threads: node halo's 16 cores, the one hot llama.cpp worker there)
    assert chat["args"][-8:] == ["--host", "0.0.0.0", "--port", "10001", "-t", "16", "--api-prefix", "/models/chat"]
    assert chat["args"][chat["args"].index("--slot-save-path") + 1] == "/var/lib/umemc/slots/chat"  # an emptyDir
    assert chat["readinessProbe"]["httpGet"] == {"path": "/models/chat/health", "port": "http"}
    assert chat["securityContext"]["readOnlyRootFilesystem"] is True
    assert chat["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "umemc-state", "mountPath": "/var/lib/umemc"},
        {"name": "files-0", "mountPath": "/srv/models", "readOnly": True},
    ]
    volumes = deployments["chat"]["spec"]["template"]["spec"]["volumes"]
    assert volumes[2] == {
        "name": "files-0",
        "persistentVolumeClaim": {
            "claimName": "models-srv-models-" + hashlib.sha256(b"/srv/models").hexdigest()[:8],
            "readOnly": True,
        },
    }
    assert all("hostPath" not in v for d in deployments.values() for v in d["spec"]["template"]["spec"]["volumes"])
    # spark is arm64: its llama-server models run the node's own image (nodes.spark.images), with its entrypoint
    code = deployments["code"]["spec"]["template"]["spec"]["containers"][0]
    assert code["image"] == "registry.example.com/llama.cpp:server-cuda-arm64-b9426" and "command" not in code
    image = deployments["image"]["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == "registry.example.com/comfyui:cuda-arm64-v0.3" and image["command"] == ["python3"]
    env = {d["metadata"]["name"]: d["data"] for _, d in docs(built) if d["kind"] == "ConfigMap"}
    assert "UMEMC_GATEWAY_URL" not in env["chat-env"]  # no umemc gateway in the cluster to lease from
    assert env["chat-env"]["UMEMC_HOST"] == "0.0.0.0"
    namespace = next(d for _, d in docs(built) if d["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pdbs = sorted(d["metadata"]["name"] for _, d in docs(built) if d["kind"] == "PodDisruptionBudget")
    assert pdbs == ["chat", "code", "embed", "umemc-gateway", "vision"]  # the hot models and the router


def test_no_node_is_given_more_gpu_pods_than_it_has_devices(built: Path) -> None:
    """halo's AMD plugin gives one pod the GPU (gpu_devices default 1); spark time-slices 4."""
    held: dict[str, int] = {}
    for _, d in docs(built):
        if d["kind"] != "Deployment" or d["spec"]["replicas"] == 0 or d["metadata"]["name"] == "umemc-gateway":
            continue
        node = d["metadata"]["annotations"]["umemc.io/node"]
        limits = d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        held[node] = held.get(node, 0) + sum(v for k, v in limits.items() if k.endswith("/gpu"))
    assert held == {"halo": 1, "spark": 3}


def test_gateway_routes_the_models_that_speak_openai(built: Path) -> None:
    config = next(
        d for _, d in docs(built) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "umemc-gateway-config"
    )
    routes = yaml.safe_load(config["data"]["config.yaml"])
    assert [(r["model_name"], r["litellm_params"]["api_base"]) for r in routes["model_list"]] == [
        ("chat", "http://chat:10001/models/chat/v1"),
        ("gpt-4o", "http://chat:10001/models/chat/v1"),
        ("code", "http://code:10002/models/code/v1"),
        ("vision", "http://vision:10003/models/vision/v1"),
        ("embed", "http://embed:10004/models/embed/v1"),
        ("text-embedding-3-small", "http://embed:10004/models/embed/v1"),
    ]  # ComfyUI (image) does not speak OpenAI: reached by its own Service
    assert routes["general_settings"] == {"master_key": "os.environ/UMEMC_GATEWAY_TOKEN"}
    gateway = next(d for _, d in docs(built) if d["kind"] == "Deployment" and d["metadata"]["name"] == "umemc-gateway")
    pod = gateway["spec"]["template"]["spec"]
    assert pod["containers"][0]["env"] == [
        {
            "name": "UMEMC_GATEWAY_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "two-node-gateway-token", "key": "token"}},
        }
    ]
    assert pod["priorityClassName"] == "umemc-two-node-gateway"
    assert pod["containers"][0]["image"] == "ghcr.io/berriai/litellm:v1.89.4"
    startup = pod["containers"][0]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 300  # LiteLLM took 106 s here
    policies = {d["metadata"]["name"]: d["spec"] for _, d in docs(built) if d["kind"] == "NetworkPolicy"}
    assert policies["umemc-models-from-gateway"]["ingress"] == [
        {
            "from": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/name": "umemc-gateway",
                            "app.kubernetes.io/instance": "two-node",
                        }
                    }
                }
            ]
        }
    ]
    # every model is reachable: the routed ones from the router, the others (ComfyUI here) on their port
    routed = {r["litellm_params"]["api_base"].split("//")[1].split(":")[0] for r in routes["model_list"]}
    for _, d in docs(built):
        if d["kind"] != "Deployment" or d["metadata"]["name"] == "umemc-gateway":
            continue
        labels = d["spec"]["template"]["metadata"]["labels"]
        selecting = sorted(
            name
            for name, spec in policies.items()
            if all(labels.get(k) == v for k, v in spec["podSelector"]["matchLabels"].items())
        )
        model = labels["app.kubernetes.io/name"]
        assert selecting == (["umemc-models-from-gateway"] if model in routed else ["umemc-models-by-service"]), model
    assert "image" not in routed and policies["umemc-models-by-service"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}]}
    ]
    readme = (built / "kubernetes" / "secrets" / "README.md").read_text()
    token = '--from-literal=token="$(openssl rand -hex 32)"'
    assert f"kubectl -n two-node create secret generic two-node-gateway-token {token}" in readme


STACK = """version = 1
name = "one"
[platform]
preset = "dgx-spark-128"
[models.chat]
runtime = "llama-server"
model = "/srv/m/chat.gguf"
arch = "llama-3-8b"
image = "registry.example.com/llama.cpp:server-cuda-arm64-b9426"
public_env = ["LOG_FORMAT"]
[models.chat.env]
HF_TOKEN = "*hf: [x] {y} 'q' 0x1F"
OPENAI_KEY = "sk-live-1234"
DATABASE_URL = "postgres://app:hunter2@db/app"
GITHUB_PAT = "ghp_abcdef"
AWS_ACCESS_KEY_ID = "AKIAEXAMPLE"
LOG_FORMAT = "on"
"""
SECRET_VALUES = ("*hf: [x]", "sk-live-1234", "hunter2", "ghp_abcdef", "AKIAEXAMPLE")


def test_env_values_are_secrets_unless_public_and_never_written(write_stack, tmp_path: Path) -> None:
    import kubernetes_validate

    out = tmp_path / "out"
    build_kubernetes(make_plan(load_stack(write_stack(STACK))), out)
    found = {(d["kind"], d["metadata"]["name"]): d for _, d in docs(out)}
    config = found[("ConfigMap", "chat-env")]
    assert config["data"]["LOG_FORMAT"] == "on"  # public, and a YAML 1.1 boolean stays a string
    assert not {"HF_TOKEN", "OPENAI_KEY", "DATABASE_URL", "GITHUB_PAT", "AWS_ACCESS_KEY_ID"} & set(config["data"])
    assert not [k for k in found if k[0] == "Secret"]  # referenced, never written
    container = found[("Deployment", "chat")]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [
        {"configMapRef": {"name": "chat-env"}},
        {"secretRef": {"name": "chat-secret", "optional": False}},
    ]
    assert (out / "kubernetes/secrets/chat-secret.env.example").read_text() == (
        "HF_TOKEN=\nOPENAI_KEY=\nDATABASE_URL=\nGITHUB_PAT=\nAWS_ACCESS_KEY_ID=\n"
    )
    readme = (out / "kubernetes/secrets/README.md").read_text()
    assert "kubectl -n one create secret generic chat-secret --from-env-file=chat-secret.env" in readme
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not [v for v in SECRET_VALUES if v in text], path
    assert "affinity" not in found[("Deployment", "chat")]["spec"]["template"]["spec"]  # one machine
    for _, d in docs(out):
        kubernetes_validate.validate(d, VERSIONS[-1], strict=True)


def test_public_env_names_env_keys(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(STACK.replace('public_env = ["LOG_FORMAT"]', 'public_env = ["LOG_FORMAT", "LOG_LEVEL"]'))
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        'stack.toml:10:29: models.chat.public_env[1]: "LOG_LEVEL" is not a key of env (keys: AWS_ACCESS_KEY_ID, '
        "DATABASE_URL, GITHUB_PAT, HF_TOKEN, LOG_FORMAT, OPENAI_KEY)\n"
        "  hint: public_env names env keys whose values are not secret\n",
    )


def test_refusals(write_stack, run_cli, tmp_path: Path) -> None:
    def build() -> tuple[int, str, str]:
        return run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", "--files-later", cwd=tmp_path)

    write_stack(STACK.replace('image = "registry.example.com/llama.cpp:server-cuda-arm64-b9426"\n', ""))
    assert build() == (
        2,
        "",
        'stack.toml:5:1: models.chat: image is required for --target kubernetes: runtime = "llama-server" on kind '
        '= "nvidia-unified" has no official image to default to (DGX Spark and Jetson are arm64, and upstream\'s '
        "CUDA images are amd64 only: build one from llama.cpp's .devops/cuda.Dockerfile)\n"
        '  hint: give image = "registry/name:version"\n',
    )
    write_stack(STACK.replace(":server-cuda-arm64-b9426", ":latest"))
    assert build() == (
        2,
        "",
        "stack.toml:9:9: models.chat.image: 'registry.example.com/llama.cpp:latest' has no fixed version: a floating "
        "tag changes under a running cluster\n  hint: pin a version tag (one with a version number, e.g. "
        "server-cuda-b6100) or a digest (image@sha256:…)\n",
    )
    write_stack(STACK.replace(":server-cuda-arm64-b9426", ":server-cuda"))  # a rolling tag: no version in it
    code, _, err = build()
    assert code == 2 and err.startswith(
        "stack.toml:9:9: models.chat.image: 'registry.example.com/llama.cpp:server-cuda' has no fixed version"
    )
    write_stack(STACK.replace('preset = "dgx-spark-128"', 'preset = "apple-silicon-64"'))
    assert build() == (
        2,
        "",
        'platform kind = "apple" cannot run models in containers with the GPU: use `umemc up`\n',
    )
    assert not (tmp_path / "out").exists()


def test_names_are_valid_kubernetes_names_or_refused_at_check(write_stack, run_cli, tmp_path: Path) -> None:
    """A model called gateway does not collide with the router (umemc-gateway), a stack name with '_' becomes
    its namespace with '-'; two models of one Kubernetes name and a label-less node whose name cannot be a
    hostname are refused by `check`, located."""
    node = 'kind = "cpu"\nmemory = "64GiB"\n'
    text = (
        'version = 1\nname = "my_stack"\n[nodes.a]\n'
        + node
        + "[nodes.b]\n"
        + node
        + '[models.gateway]\nruntime = "command"\ncommand = ["serve", "--host", "{host}", "--port", "{port}"]\n'
        'memory = "1GiB"\nimage = "registry.example.com/serve:1.0"\n'
    )
    write_stack(text)
    code, _, err = run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", cwd=tmp_path)
    assert code == 0, err
    found = {(d["kind"], d["metadata"]["name"]) for _, d in docs(tmp_path / "out")}
    assert {("Deployment", "gateway"), ("Deployment", "umemc-gateway"), ("Namespace", "my-stack")} <= found
    kustomization = yaml.safe_load((tmp_path / "out/kubernetes/kustomization.yaml").read_text())
    assert kustomization["namespace"] == "my-stack"
    deployment = next(
        d for _, d in docs(tmp_path / "out") if d["metadata"]["name"] == "gateway" and d["kind"] == "Deployment"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--host", "0.0.0.0", "--port", "10001"]  # {host}: every address in a pod
    code, _, err = run_cli("build", "stack.toml", "-o", "local", cwd=tmp_path)
    assert code == 0, err
    plan = json.loads((tmp_path / "local/nodes/a/plan.json").read_text())
    assert plan["models"]["gateway"]["argv"] == ["serve", "--host", "127.0.0.1", "--port", "10001"]  # loopback here

    write_stack(
        text
        + '[models.chat_2]\nruntime = "command"\ncommand = ["x"]\nmemory = "1GiB"\n'
        + '[models.chat-2]\nruntime = "command"\ncommand = ["x"]\nmemory = "1GiB"\n'
    )
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        'stack.toml:18:9: models.chat-2: "chat-2" and "chat_2" are the same Kubernetes name "chat-2" (\'_\' becomes '
        "'-', a '-' at the end goes)\n  hint: rename one of them\n",
    )
    write_stack(text.replace("[nodes.b]", "[nodes.b_2]"))
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        "stack.toml:6:1: nodes.b_2: a node without labels is found by its hostname (kubernetes.io/hostname = "
        "\"b_2\"), and a hostname cannot contain '_'\n"
        '  hint: name the node as its hostname, or give labels = { "umemc.io/node" = "b-2" }\n',
    )


def test_a_cold_model_gets_one_deployment_per_variant_of_its_nodes(write_stack, tmp_path: Path) -> None:
    """Each variant carries its nodes' image, GPU resource, environment and limits: the figures of the plan
    on that node, not the home node's; two nodes of one platform and image share a Deployment (one of the
    same kind with other cores does not: its worker gets other threads)."""
    text = """version = 1
name = "mixed"
[nodes.halo]
preset = "strix-halo-128"
labels = { "umemc.io/node" = "halo" }
[nodes.halo2]
preset = "strix-halo-128"
labels = { "umemc.io/node" = "halo2" }
[nodes.halo8]
preset = "strix-halo-128"
cpu_cores = 8
labels = { "umemc.io/node" = "halo8" }
[nodes.spark]
preset = "dgx-spark-128"
labels = { "umemc.io/node" = "spark" }
gpu_devices = 2
images = { llama-server = "registry.example.com/llama.cpp:server-cuda-arm64-b9426" }
[models.side]
runtime = "llama-server"
model = "/srv/m/side.gguf"
arch = "llama-3-8b"
mode = "cold"
priority = 30
"""
    out = tmp_path / "out"
    plan = make_plan(load_stack(write_stack(text)))
    build_kubernetes(plan, out)
    found = {d["metadata"]["name"]: d for _, d in docs(out) if d["kind"] == "Deployment"}
    assert sorted(found) == ["side-halo", "side-halo8", "side-spark", "umemc-gateway"]
    for node, image, gpu in (
        ("halo", "ghcr.io/ggml-org/llama.cpp:server-vulkan-b9426", "amd.com/gpu"),
        ("spark", "registry.example.com/llama.cpp:server-cuda-arm64-b9426", "nvidia.com/gpu"),
    ):
        d = found[f"side-{node}"]
        want = plan.variants["side"][node]
        container = d["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == image
        assert container["resources"]["limits"] == {"memory": str(want.quota_hard), gpu: 1}
        assert d["spec"]["replicas"] == 0
        assert d["spec"]["selector"]["matchLabels"]["umemc.io/node"] == node
        config = next(
            x for _, x in docs(out) if x["kind"] == "ConfigMap" and x["metadata"]["name"] == f"side-{node}-env"
        )
        assert config["data"]["UMEMC_QUOTA_HARD_BYTES"] == str(want.quota_hard)
    env = {
        n: next(x for _, x in docs(out) if x["metadata"]["name"] == f"side-{n}-env")["data"]
        for n in ("halo", "halo8", "spark")
    }
    assert (env["halo"]["OMP_NUM_THREADS"], env["halo8"]["OMP_NUM_THREADS"]) == ("16", "8")  # no hot model: 1
    assert "HSA_ENABLE_SDMA" in env["halo"] and "HSA_ENABLE_SDMA" not in env["spark"]  # each node's own knobs
    assert "GGML_CUDA_ENABLE_UNIFIED_MEMORY" not in env["spark"]  # managed memory may escape the quota's figure
    terms = found["side-halo"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "umemc.io/node", "operator": "In", "values": ["halo", "halo2"]}]}]
    assert found["side-halo"]["metadata"]["annotations"]["umemc.io/node"] == "halo,halo2"
    services = [d for _, d in docs(out) if d["kind"] == "Service" and d["metadata"]["name"] == "side"]
    assert services[0]["spec"]["selector"] == {"app.kubernetes.io/name": "side", "app.kubernetes.io/instance": "mixed"}


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


def _cmd(name: str, extra: str = "") -> str:
    return (
        f'[models.{name}]\nruntime = "command"\ncommand = ["serve", "{{port}}"]\nmemory = "1GiB"\n'
        f'image = "registry.example.com/serve:1.0"\n{extra}'
    )


def test_names_that_would_collide_or_be_refused_by_the_api_server(write_stack, run_cli, tmp_path: Path) -> None:
    """A model called umemc_gateway is the router's name once '_' becomes '-': refused; a stack named lab_ gets the
    namespace lab (a DNS label ends alphanumeric); a cold model's per-node Deployment that would spell another
    model's name gets a digest; an image pinned by tag and digest gives a valid version label."""
    node = 'kind = "cpu"\nmemory = "64GiB"\n'
    write_stack(f'version = 1\nname = "lab_"\n[nodes.a]\n{node}' + _cmd("umemc_gateway"))
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        'stack.toml:6:9: models.umemc_gateway: "umemc_gateway" is reserved for umemc\'s own program (as '
        '"umemc-gateway", its Kubernetes name)\n  hint: choose another model name\n',
    )
    digest = "sha256:" + "ab" * 32
    write_stack(
        f'version = 1\nname = "lab_"\n[nodes.a]\n{node}[nodes.a.images]\ncommand = "registry.example.com/serve:1.0"\n'
        f'[nodes.b]\n{node}[nodes.b.images]\ncommand = "registry.example.com/serve:1.0-arm@{digest}"\n'
        + _cmd("chat", 'mode = "cold"\n').replace('image = "registry.example.com/serve:1.0"\n', "")
        + _cmd("chat-b", 'node = "a"\n')
    )
    code, _, err = run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", cwd=tmp_path)
    assert code == 0, err
    found = [(d["kind"], d["metadata"]["name"]) for _, d in docs(tmp_path / "out")]
    assert ("Namespace", "lab") in found
    assert yaml.safe_load((tmp_path / "out/kubernetes/kustomization.yaml").read_text())["namespace"] == "lab"
    deployments = sorted(name for kind, name in found if kind == "Deployment")
    clash = hashlib.sha256(b"chat/b").hexdigest()[:8]  # chat's variant on node b against the model chat-b
    assert deployments == sorted(["chat-a", f"chat-b-{clash}", "chat-b", "umemc-gateway"])
    labels = [d["metadata"]["labels"] for _, d in docs(tmp_path / "out") if d["metadata"]["name"] == f"chat-b-{clash}"]
    assert {x.get("app.kubernetes.io/version") for x in labels} == {"1.0-arm"}  # not "1.0-arm@sha256:…"
    assert all(x["metadata"]["labels"]["app.kubernetes.io/part-of"] == "lab" for _, x in docs(tmp_path / "out"))


def test_model_files_get_one_claim_per_exact_directory_sized_by_the_files(write_stack, tmp_path: Path) -> None:
    """Directories the label alone would merge (/srv/Models and /srv/models; two long paths alike in their first
    40 characters) get claims of their own; a claim asks for the files it holds once (a cold model's variants
    share them), at their size on disk, not the estimate of the weights in memory."""
    root = tmp_path / "srv"
    upper, lower = root / "Models", root / "models"
    longer = [root / ("x" * 40 + "-one"), root / ("x" * 40 + "-two")]
    for d in (upper, lower, *longer):
        d.mkdir(parents=True)
    from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

    sizes = {}
    for d in (upper, lower, *longer):
        path = write_tiny_gguf(
            d / "m.gguf", TinySpec(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=300)
        )
        sizes[str(d)] = path.stat().st_size
    node = 'kind = "cpu"\nmemory = "64GiB"\n'
    text = 'version = 1\nname = "files"\n[nodes.a]\n' + node + "[nodes.b]\n" + node
    for i, d in enumerate((upper, lower, *longer)):
        mode = 'mode = "cold"\n' if i == 0 else ""
        text += (
            f'[models.m{i}]\nruntime = "llama-server"\nmodel = "{d}/m.gguf"\n{mode}'
            'image = "registry.example.com/llama.cpp:server-b9426"\n'
        )
    out = tmp_path / "out"
    build_kubernetes(make_plan(load_stack(write_stack(text))), out)
    claims = {
        d["metadata"]["annotations"]["umemc.io/mount-path"]: d
        for _, d in docs(out)
        if d["kind"] == "PersistentVolumeClaim"
    }
    assert sorted(claims) == sorted(sizes)
    names = [c["metadata"]["name"] for c in claims.values()]
    assert len(set(names)) == 4 and all(len(n) <= 63 for n in names)
    for d, claim in claims.items():  # a tenth more than the files, in whole GiB: these tiny files ask 1Gi each
        assert claim["spec"]["resources"]["requests"]["storage"] == f"{max(1, -(-sizes[d] * 11 // 10 // 2**30))}Gi"
    mounted = {
        v["persistentVolumeClaim"]["claimName"]
        for _, d in docs(out)
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert mounted == set(names)


def test_pods_that_can_start(write_stack, tmp_path: Path) -> None:
    """A llama-server with an image of its own still runs the image's entrypoint (llama.cpp's images keep the
    server at /app/llama-server, off PATH), unless bin names it; a model's own image on a node that names another
    for its runtime (an arm64 node) is refused, not silently run there; the torch example listens on the pod's
    address (its probes reach it)."""
    text = (
        'version = 1\nname = "pods"\n[platform]\nkind = "cpu"\nmemory = "64GiB"\n[models.chat]\n'
        'runtime = "llama-server"\nmodel = "/srv/m/chat.gguf"\narch = "llama-3-8b"\n'
        'image = "registry.example.com/llama.cpp:server-b9426"\n'
    )
    out = tmp_path / "out"
    build_kubernetes(make_plan(load_stack(write_stack(text))), out)
    [container] = [d for _, d in docs(out) if d["kind"] == "Deployment" and d["metadata"]["name"] == "chat"][0]["spec"][
        "template"
    ]["spec"]["containers"]
    assert "command" not in container and container["args"][:2] == ["-m", "/srv/m/chat.gguf"]
    build_kubernetes(make_plan(load_stack(write_stack(text + 'bin = "/opt/llama/bin/llama-server"\n'))), out)
    [container] = [d for _, d in docs(out) if d["kind"] == "Deployment" and d["metadata"]["name"] == "chat"][0]["spec"][
        "template"
    ]["spec"]["containers"]
    assert container["command"] == ["/opt/llama/bin/llama-server"]
    spark = (
        'version = 1\nname = "arm"\n[nodes.spark]\npreset = "dgx-spark-128"\n'
        'images = { llama-server = "registry.example.com/llama.cpp:server-cuda-arm64-b9426" }\n[models.chat]\n'
        'runtime = "llama-server"\nmodel = "/srv/m/chat.gguf"\narch = "llama-3-8b"\n'
        'image = "registry.example.com/llama.cpp:server-cuda-b9426"\n'
    )
    from umemc.errors import StackError

    with pytest.raises(StackError) as refused:
        build_kubernetes(make_plan(load_stack(write_stack(spark))), tmp_path / "arm")
    assert (
        str(refused.value)
        .split("/stack.toml:", 1)[1]
        .startswith(
            "10:9: models.chat.image: 'registry.example.com/llama.cpp:server-cuda-b9426' would run on node "
            "spark, which names its own llama-server image"
        )
    )


def test_a_command_worker_says_whether_it_uses_the_gpu(write_stack, run_cli, tmp_path: Path) -> None:
    """A command worker is counted in the GPU window (the safe side), and so its pod holds the GPU device it is
    charged to (a command worker running vLLM charged to a GPU its pod was not given: another pod holds it); gpu =
    false: neither (the GPU ledger and the device count leave it out)."""
    text = (
        'version = 1\nname = "dev"\n[nodes.spark]\npreset = "dgx-spark-128"\ngpu_devices = 2\n'
        '[models.big]\nruntime = "command"\ncommand = ["serve", "{port}"]\nmemory = "40GiB"\ngpu = true\n'
        'image = "registry.example.com/serve:1.0"\n'
        '[models.tool]\nruntime = "command"\ncommand = ["tool", "{port}"]\nmemory = "20GiB"\n'
        'image = "registry.example.com/tool:1.0"\n'
    )

    def built(extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
        write_stack(text + extra)
        code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
        assert code == 0, err
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        code, _, err = run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", cwd=tmp_path)
        assert code == 0, err
        pods = {
            d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            for _, d in docs(tmp_path / "out")
            if d["kind"] == "Deployment"
        }
        return json.loads(out)["models"]["tool"], pods

    tool, pods = built("")
    assert tool["gpu_bytes"] == 20 * 2**30  # explicit memory, all of it assumed in the GPU window
    assert pods["big"]["nvidia.com/gpu"] == 1 and pods["tool"]["nvidia.com/gpu"] == 1  # so it holds the device
    tool, pods = built("gpu = false\n")
    assert tool["gpu_bytes"] == 0 and "nvidia.com/gpu" not in pods["tool"]
    assert pods["big"]["nvidia.com/gpu"] == 1


KEDA_CRD = REPO / "tests" / "recorded" / "keda" / "http.keda.sh_httpscaledobjects-v0.15.0.yaml"


def test_cold_models_start_on_a_request_through_kedas_http_add_on(write_stack, tmp_path: Path) -> None:
    """kubernetes-keda/: an HTTPScaledObject per cold llama-server model, valid against the CRD KEDA's HTTP add-on
    publishes (v0.15.0, tests/recorded/keda), whose path is the one the model's server serves under
    (--api-prefix) and the one the overlay's router sends it on through the interceptor; scaled back to zero
    after its ttl. Hot models keep their direct route; a ComfyUI model (not routed) gets no scaler."""
    import jsonschema

    text = (
        'version = 1\nname = "lab"\n[nodes.halo]\npreset = "strix-halo-128"\n'
        'labels = { "umemc.io/node" = "halo" }\n'
        '[models.chat]\nruntime = "llama-server"\nmodel = "/srv/m/chat.gguf"\narch = "llama-3-8b"\npriority = 90\n'
        '[models.code]\nruntime = "llama-server"\nmodel = "/srv/m/code.gguf"\narch = "qwen2.5-7b"\nmode = "cold"\n'
        'ttl = "5m"\nmax_concurrency = 2\n'
        '[models.image]\nruntime = "comfyui"\narch = "sdxl"\nmode = "cold"\n'
        'image = "registry.example.com/comfyui:v0.3.40"\n'
    )
    out = tmp_path / "out"
    build_kubernetes(make_plan(load_stack(write_stack(text))), out)
    keda = out / "kubernetes-keda"
    assert sorted(p.name for p in keda.iterdir()) == [
        "gateway-config.yaml", "httpscaledobjects.yaml", "kustomization.yaml", "networkpolicy.yaml",
    ]  # fmt: skip
    crd = yaml.safe_load(KEDA_CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    [scaler] = list(yaml.safe_load_all((keda / "httpscaledobjects.yaml").read_text()))
    jsonschema.validate(scaler, version["schema"]["openAPIV3Schema"])
    ref = scaler["spec"]["scaleTargetRef"]
    assert ("portName" in ref) != ("port" in ref)  # the CRD's x-kubernetes-validations rule, by hand
    assert scaler["apiVersion"] == f"{crd['spec']['group']}/v1alpha1" and scaler["kind"] == crd["spec"]["names"]["kind"]
    base = {(d["kind"], d["metadata"]["name"]): d for _, d in docs(out) if not _.startswith("kubernetes-keda/")}
    deployment = base[("Deployment", ref["name"])]
    assert deployment["spec"]["replicas"] == 0 and deployment["metadata"]["annotations"]["umemc.io/mode"] == "cold"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    prefix = container["args"][container["args"].index("--api-prefix") + 1]
    assert (prefix, scaler["spec"]["pathPrefixes"]) == ("/models/code", ["/models/code/"])
    assert container["startupProbe"]["httpGet"]["path"] == "/models/code/health"
    service = base[("Service", ref["service"])]
    assert ref["portName"] in [p["name"] for p in service["spec"]["ports"]]
    assert scaler["spec"]["replicas"] == {"min": 0, "max": 1} and scaler["spec"]["scaledownPeriod"] == 300
    assert scaler["spec"]["scalingMetric"] == {"concurrency": {"targetValue": 2}}
    [patch] = list(yaml.safe_load_all((keda / "gateway-config.yaml").read_text()))
    routes = {
        r["model_name"]: r["litellm_params"]["api_base"]
        for r in yaml.safe_load(patch["data"]["config.yaml"])["model_list"]
    }
    assert routes == {
        "chat": "http://chat:10001/models/chat/v1",  # hot: straight to its Service
        "code": "http://keda-add-ons-http-interceptor-proxy.keda:8080/models/code/v1",  # cold: KEDA starts it
    }
    assert patch["metadata"]["name"] == base[("ConfigMap", "umemc-gateway-config")]["metadata"]["name"]
    kustomization = yaml.safe_load((keda / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "../kubernetes" and kustomization["namespace"] == "lab"
    [policy] = list(yaml.safe_load_all((keda / "networkpolicy.yaml").read_text()))
    assert policy["spec"]["podSelector"]["matchExpressions"][1]["values"] == ["code"]
    # a real kustomize builds both: the base, and the overlay as the base with its objects and its patch applied
    built = {d: kustomize(out / d) for d in ("kubernetes", "kubernetes-keda")}
    names = {d: sorted((o["kind"], o["metadata"]["name"]) for o in objs) for d, objs in built.items()}
    assert len(set(names["kubernetes-keda"])) == len(names["kubernetes-keda"])  # no object twice
    assert sorted(set(names["kubernetes-keda"]) - set(names["kubernetes"])) == [
        ("HTTPScaledObject", "code"), ("NetworkPolicy", "umemc-models-from-keda"),
    ]  # fmt: skip
    [routed] = [o for o in built["kubernetes-keda"] if o["metadata"]["name"] == "umemc-gateway-config"]
    assert yaml.safe_load(routed["data"]["config.yaml"]) == yaml.safe_load(patch["data"]["config.yaml"])


MIXED = """version = 1
name = "lab_cluster_"
[nodes.halo128]
preset = "strix-halo-128"
[nodes.halo96]
preset = "strix-halo-128"
memory = "96GiB"
gpu_window = "88GiB"
[nodes.halo64]
preset = "strix-halo-64"
[nodes.spark_a]
preset = "dgx-spark-128"
labels = { "umemc.io/node" = "spark-a" }
images = { llama-server = "registry.example.com/llama.cpp:server-cuda-arm64-b9426" }
[nodes.spark_b]
preset = "dgx-spark-128"
labels = { "umemc.io/node" = "spark-b" }
images = { llama-server = "registry.example.com/llama.cpp:server-cuda-arm64-b9426" }
[nodes.jetson]
preset = "jetson-orin-64"
images = { llama-server = "registry.example.com/llama.cpp:server-cuda-jetson-b9426" }
[nodes.gpubox]
kind = "nvidia-discrete"
memory = "128GiB"
gpu_window = "48GiB"
gpu_devices = 4
[nodes.cpu1]
kind = "cpu"
memory = "64GiB"
[nodes.cpu2]
kind = "cpu"
memory = "64GiB"
"""


def _mixed_models() -> str:
    out = []
    archs = ["llama-3-8b", "qwen2.5-7b", "qwen3-30b-a3b", "gemma-3-12b", "phi-4", "mistral-small-3.2-24b"]
    for k in range(14):
        mode = "cold" if k % 3 == 0 else "hot"
        out.append(
            f'[models.chat_{k}]\nruntime = "llama-server"\nmodel = "/srv/Models/chat_{k}.gguf"\n'
            f'arch = "{archs[k % len(archs)]}"\ncontext = 4096\nmode = "{mode}"\npriority = {20 + 5 * k}\n'
        )
    out.append('[models.embed_m3]\nruntime = "llama-cpp-python"\nmodel = "/srv/models/bge-m3.gguf"\narch = "bge-m3"\n'
               'image = "registry.example.com/llama-cpp-python:0.3.36"\n')  # fmt: skip
    out.append(
        '[models.whisper_1]\nruntime = "whisper-server"\nmodel = "/srv/models/ggml-large-v3.bin"\n'
        'arch = "whisper-large-v3"\nmode = "cold"\nimage = "registry.example.com/whisper.cpp:1.7.6"\n'
    )
    out.append(
        '[models.image_xl]\nruntime = "comfyui"\narch = "sdxl"\nmode = "cold"\ncwd = "/opt/ComfyUI"\n'
        'image = "registry.example.com/comfyui:v0.3.40"\n'
    )
    out.append(
        '[models.torch_emb]\nruntime = "torch"\nmodule = "embedder"\narch = "bge-m3"\n'
        'image = "registry.example.com/umemc-torch:2.13.0"\n'
    )
    for k in range(3):
        out.append(
            f'[models.tool_{k}]\nruntime = "command"\ncommand = ["serve", "--host", "{{host}}", "--port", '
            f'"{{port}}"]\nmemory = "2GiB"\ngpu = false\nimage = "registry.example.com/tool:1.{k}"\n'
        )
    return "\n".join(out)


def _strict_valid(found: list[tuple[str, dict[str, Any]]]) -> None:
    import kubernetes_validate

    for path, d in found:
        if d["kind"] == "HTTPScaledObject":  # KEDA's: validated against its own CRD in the test above
            continue
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path} {d['kind']}/{d['metadata']['name']} against {version}: {exc}")


def _pod_references(objects: dict[tuple[str, str], dict[str, Any]], name: str, d: dict[str, Any]) -> list[tuple]:
    """What a Deployment's pod names that must exist: its PriorityClass, ConfigMaps and claims."""
    pod = d["spec"]["template"]["spec"]
    refs: list[tuple] = [("PriorityClass", pod["priorityClassName"])]
    refs += [
        ("ConfigMap", s["configMapRef"]["name"]) for s in pod["containers"][0].get("envFrom", []) if "configMapRef" in s
    ]
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            refs.append(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
        if "configMap" in volume:
            refs.append(("ConfigMap", volume["configMap"]["name"]))
    return refs


def test_a_mixed_cluster_gives_objects_the_api_server_accepts(write_stack, tmp_path: Path) -> None:
    """Strix Halo 128/96/64, two arm64 DGX Sparks, a Jetson, a 4-device discrete GPU box, two CPU nodes; 22
    models of every runtime, names with "_" (and a "_" at the end), capitals in paths: every object valid
    (strict) against the official schemas, names unique per kind and valid DNS labels, every reference
    (ConfigMap, Service selector, PriorityClass, PersistentVolumeClaim, the router's upstreams, KEDA's targets)
    resolving, every model pod selected by exactly one of the base NetworkPolicies."""
    import re

    out = tmp_path / "out"
    build_kubernetes(make_plan(load_stack(write_stack(MIXED + _mixed_models()))), out)
    found = docs(out)
    _strict_valid(found)
    base = [(p, d) for p, d in found if not p.startswith("kubernetes-keda/")]
    by_kind: dict[str, list[str]] = {}
    for _, d in base:
        by_kind.setdefault(d["kind"], []).append(d["metadata"]["name"])
    label = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
    for kind, names in by_kind.items():
        assert len(names) == len(set(names)), kind
        assert all(label.fullmatch(n) for n in names if kind != "PriorityClass"), (kind, names)
    objects = {(d["kind"], d["metadata"]["name"]): d for _, d in base}
    assert ("Namespace", "lab-cluster") in objects
    policies = [d["spec"] for (k, _), d in objects.items() if k == "NetworkPolicy"]
    deployments = {n: d for (k, n), d in objects.items() if k == "Deployment"}
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert all(labels[k] == v for k, v in d["spec"]["selector"]["matchLabels"].items())
        assert all(ref in objects for ref in _pod_references(objects, name, d)), name
        selecting = [p for p in policies if all(labels.get(k) == v for k, v in p["podSelector"]["matchLabels"].items())]
        assert name == "umemc-gateway" or len(selecting) == 1, name
    services = {n: d for (k, n), d in objects.items() if k == "Service"}
    for name, svc in services.items():
        selector = svc["spec"]["selector"]
        pods = [d["spec"]["template"]["metadata"]["labels"] for d in deployments.values()]
        assert any(all(p.get(k) == v for k, v in selector.items()) for p in pods), name
    config = yaml.safe_load(objects[("ConfigMap", "umemc-gateway-config")]["data"]["config.yaml"])
    for route in config["model_list"]:
        host, port = route["litellm_params"]["api_base"].split("//")[1].split("/")[0].split(":")
        assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
    scalers = list(yaml.safe_load_all((out / "kubernetes-keda/httpscaledobjects.yaml").read_text()))
    assert scalers  # the cold llama-server models
    for s in scalers:
        ref = s["spec"]["scaleTargetRef"]
        assert ref["name"] in deployments and ref["service"] in services
    assert all(len(n) <= 63 for names in by_kind.values() for n in names)


LEASE_STACK = """version = 1
name = "lab_"
[nodes.halo]
preset = "strix-halo-64"
labels = { "umemc.io/node" = "halo" }
[nodes.box]
kind = "cpu"
memory = "64GiB"
[models.big]
runtime = "command"
command = ["serve", "{port}"]
image = "registry.example.com/serve:1.0"
memory = "30GiB"
node = "halo"
gpu = true
priority = 20
[models.small]
runtime = "command"
command = ["serve", "{port}"]
image = "registry.example.com/serve:1.0"
memory = "4GiB"
node = "box"
priority = 70
"""


def test_a_lease_is_a_pod_the_scheduler_accounts_like_a_model(write_stack, run_cli, tmp_path: Path) -> None:
    """`umemc lease-pod`: the lease's PriorityClass and a pause pod holding its memory at its priority, ended after
    its ttl, valid against the official schemas; stderr says per node what it preempts (the one policy on paper:
    on halo (47.6 GiB of budget, `big` holds 33 of it) a 20 GiB lease at priority 60 fits only by stopping `big`
    (priority 20, which also holds the node's only GPU device); on box it fits beside `small`)."""
    import kubernetes_validate

    stack = write_stack(LEASE_STACK)
    code, out, err = run_cli("lease-pod", str(stack), "--bytes", "20GiB", "--priority", "60", "--holder", "comfy_ui",
                             "--ttl", "90s")  # fmt: skip
    assert code == 0
    assert err.splitlines() == ["halo: preempts big", "box: fits beside the models placed there"]
    pc, pod = list(yaml.safe_load_all(out))
    for d in (pc, pod):
        kubernetes_validate.validate(d, VERSIONS[-1], strict=True)
    assert (pc["kind"], pc["metadata"]["name"], pc["value"]) == ("PriorityClass", "umemc-lab-p60", 60)
    assert pod["metadata"]["name"] == "lease-comfy-ui" and pod["metadata"]["namespace"] == "lab"
    spec = pod["spec"]
    assert (spec["priorityClassName"], spec["activeDeadlineSeconds"], spec["restartPolicy"]) == (
        "umemc-lab-p60",
        90,
        "Never",
    )
    assert spec["containers"][0]["resources"] == {
        "requests": {"memory": str(20 << 30), "cpu": "1m"},
        "limits": {"memory": str(20 << 30)},
    }
    code, out, err = run_cli("lease-pod", str(stack), "--bytes", "2GiB", "--priority", "60", "--node", "halo",
                             "--gpu-device")  # fmt: skip
    pod = list(yaml.safe_load_all(out))[1]
    assert (code, err.splitlines()) == (0, ["halo: preempts big"])  # memory to spare, but the only device is big's
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"memory": str(2 << 30), "amd.com/gpu": 1}
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "umemc.io/node", "operator": "In", "values": ["halo"]}]}]
    }
    code, out, err = run_cli("lease-pod", str(stack), "--bytes", "2GiB", "--priority", "10", "--node", "halo",
                             "--gpu-device")  # fmt: skip
    assert (code, out, err) == (  # a pod no node can take would wait Pending for ever: not printed
        1,
        "",
        "halo: cannot be placed (even preempting every lower-priority model)\n"
        "umemc lease-pod: no node can hold 2GiB at priority 10: its pod would wait Pending for ever; not printed\n",
    )
    # a holder of capitals and past a label's 63 characters: valid names and labels, its spelling annotated
    holder = "ComfyUI_Worker-" + "x" * 80
    code, out, _ = run_cli("lease-pod", str(stack), "--bytes", "2GiB", "--priority", "60", "--holder", holder)
    pod = list(yaml.safe_load_all(out))[1]
    kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)
    import hashlib
    import re

    expected = "comfyui-worker-" + "x" * 35 + "-" + hashlib.sha256(holder.encode()).hexdigest()[:6]
    assert (code, pod["metadata"]["name"], pod["metadata"]["labels"]["app.kubernetes.io/name"]) == (
        0,
        f"lease-{expected}",
        expected,
    )
    assert all(
        len(v) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", v) for v in pod["metadata"]["labels"].values()
    )
    assert pod["metadata"]["annotations"]["umemc.io/holder"] == holder
    assert run_cli("lease-pod", str(stack), "--bytes", "2GiB", "--priority", "60", "--name", "Lease_A")[::2] == (
        2,
        "--name 'Lease_A': not a Pod name: lowercase letters, digits and '-', starting and ending with a letter or "
        "digit, at most 63 characters\n",
    )
    assert run_cli("lease-pod", str(stack), "--bytes", "2GiB", "--priority", "101") == (
        2,
        "",
        "--priority 101: must be 0-100\n",
    )
    assert run_cli("lease-pod", str(stack), "--bytes", "2GiB", "--priority", "50", "--node", "nope")[::2] == (
        2,
        "--node nope: not a node of this stack (its nodes: halo, box)\n",
    )


def test_a_cold_gpu_models_admission_counts_the_nodes_devices(write_stack, run_cli) -> None:
    """On halo `big` (priority 20) holds the only GPU device and 33 of its 47.6 GiB: a cold GPU model of 2 GiB at
    priority 60 has the memory to start beside it, not the device. The report (check's JSON and budget.md), the
    placement and explain give one answer: its start stops `big`."""
    text = LEASE_STACK + (
        '[models.vision]\nruntime = "command"\ncommand = ["serve", "{port}"]\n'
        'image = "registry.example.com/serve:1.0"\nmemory = "2GiB"\nnode = "halo"\ngpu = true\nmode = "cold"\n'
        "priority = 60\n"
    )
    stack = write_stack(text)
    code, out, _ = run_cli("check", str(stack), "--format", "json")
    assert code == 0
    report = json.loads(out)
    assert report["cold_admission"]["vision"] == {"fits_alongside_hot": False, "admissible": True, "evicts": ["big"]}
    assert report["placement"]["cold"]["vision"] == {"halo": ["big"]}
    code, out, _ = run_cli("check", str(stack), "--format", "markdown")
    assert "- `vision`: starts by evicting big" in out.splitlines()
    code, out, _ = run_cli("explain", str(stack), "vision")
    lines = out.splitlines()
    assert "  node: cold; starts on halo by evicting big; admissible on halo" in lines
    assert "  cold start: fits alongside hot set False, admissible True, evicts ['big']" in lines


def test_a_cold_model_no_request_can_start_in_a_cluster_is_said_at_its_key(write_stack, run_cli, tmp_path) -> None:
    """A cold ComfyUI model: KEDA's HTTP add-on cannot route to it by a path (its server takes no prefix), so
    nothing starts it on a request; `build --target kubernetes` says so at its `mode`, with what does start it.
    The cold llama-server model beside it gets its scaler and no warning."""
    text = (
        'version = 1\nname = "lab"\n[nodes.halo]\npreset = "strix-halo-128"\n'
        '[models.code]\nruntime = "llama-server"\nmodel = "/srv/m/code.gguf"\narch = "qwen2.5-7b"\nmode = "cold"\n'
        '[models.image]\nruntime = "comfyui"\narch = "sdxl"\nmode = "cold"\n'
        'image = "registry.example.com/comfyui:v0.3.40"\n'
    )
    stack = write_stack(text)
    code, _, err = run_cli("build", str(stack), "--target", "kubernetes", "-o", str(tmp_path / "out"))
    assert code == 0, err
    said = [line for line in err.splitlines() if "does not start on a request" in line]
    assert said == [
        f"warning: {stack}:13:8: models.image.mode: a cold comfyui model does not start on a request in a cluster "
        "(KEDA's HTTP add-on routes by a path prefix its server would serve under, and comfyui takes none): it stays "
        "at 0 replicas until `kubectl scale deployment/image --replicas 1 -n lab`, or make it hot"
    ]
    scalers = list(yaml.safe_load_all((tmp_path / "out" / "kubernetes-keda" / "httpscaledobjects.yaml").read_text()))
    assert [s["metadata"]["name"] for s in scalers] == ["code"]
