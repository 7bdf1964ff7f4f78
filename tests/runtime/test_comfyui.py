"""The ComfyUI extension (integrations/comfyui) against umemc's real gateway: a workflow's model files size a
lease taken before the prompt is queued and released after it ran; a refusal turns the prompt into one node
whose validation error carries umemc's reason. ComfyUI itself is not installable here (not on PyPI with its
server/execution modules): the executor wrapper runs on a stand-in with ComfyUI's `execute` signature."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from integrations.comfyui.client import LeaseClient, Refused
from integrations.comfyui.hook import EXTRA, LeaseHook, UmemcRefused
from integrations.comfyui.sizing import ACTIVATIONS, SLACK, lease_bytes, workflow_files
from tests.runtime.test_gateway import Gateway, model, stack_text

MiB = 2**20

WORKFLOW: dict[str, Any] = {  # ComfyUI's API format: node id -> class_type and inputs
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
    "10": {"class_type": "LoraLoader", "inputs": {"lora_name": "style.safetensors", "model": ["4", 0]}},
    "11": {"class_type": "VAELoader", "inputs": {"vae_name": "missing.safetensors"}},
    "3": {"class_type": "KSampler", "inputs": {"model": ["10", 0], "seed": 1}},
}


def models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for kind, name, size in (("checkpoints", "sdxl.safetensors", 6 * MiB), ("loras", "style.safetensors", MiB)):
        (root / kind).mkdir(parents=True, exist_ok=True)
        with open(root / kind / name, "wb") as f:
            f.truncate(size)  # sparse: its size is what counts
    return root


def resolver(root: Path):  # type: ignore[no-untyped-def]
    def resolve(kind: str, name: str) -> str | None:
        path = root / kind / name
        return str(path) if path.exists() else None

    return resolve


def test_sizing_counts_the_files_loader_nodes_name(tmp_path: Path) -> None:
    root = models_dir(tmp_path)
    assert workflow_files(WORKFLOW) == [
        ("checkpoints", "sdxl.safetensors"),
        ("loras", "style.safetensors"),
        ("vae", "missing.safetensors"),
    ]
    nbytes, files = lease_bytes(WORKFLOW, resolver(root))
    assert files == ["checkpoints/sdxl.safetensors", "loras/style.safetensors"]  # the missing VAE is left out
    assert nbytes == int(7 * MiB * SLACK) + ACTIVATIONS


def test_a_prompt_leases_before_it_runs_and_releases_after(stack: Any, tmp_path: Path) -> None:
    text = stack_text("cf-ok", model("image", priority=50), slots=3)
    gw = Gateway(stack(text, "--simulate"))
    client = LeaseClient(f"http://127.0.0.1:{gw.port}", model="image")
    hook = LeaseHook(client, resolver(models_dir(tmp_path)))
    # ACTIVATIONS is 2 GiB: this small budget cannot hold it; size the lease for the test's budget instead
    from integrations.comfyui import sizing

    old = sizing.ACTIVATIONS
    sizing.ACTIVATIONS = 8 * MiB
    try:
        out = hook.on_prompt({"prompt": WORKFLOW, "client_id": "c1"})
    finally:
        sizing.ACTIVATIONS = old
    lease = out["extra_data"][EXTRA]
    leases = gw.call("GET", "/umemc/leases")[2]["leases"]
    assert [(x["id"], x["holder"], x["bytes"]) for x in leases] == [
        (lease, "comfyui:image", int(7 * MiB * SLACK) + 8 * MiB)
    ]
    assert out["prompt"] == WORKFLOW  # granted: the prompt runs as it was

    class Executor:  # ComfyUI's execution.PromptExecutor.execute signature
        ran: list[str] = []

        def execute(self, prompt: Any, prompt_id: str, extra_data: dict[str, Any], execute_outputs: list[str]) -> None:
            Executor.ran.append(prompt_id)
            raise RuntimeError("a node failed")  # the lease goes back whichever way the prompt ends

    hook.wrap_executor(Executor)
    try:
        Executor().execute(out["prompt"], "p1", out["extra_data"], ["3"])
    except RuntimeError:
        pass
    assert Executor.ran == ["p1"]
    assert gw.call("GET", "/umemc/leases")[2]["leases"] == []
    assert [e["kind"] for e in gw.run.events() if e["kind"].startswith("lease")] == ["lease_grant", "lease_release"]


def test_a_refused_prompt_shows_umemcs_reason(stack: Any, tmp_path: Path) -> None:
    text = stack_text("cf-no", model("chat", priority=90, mode="hot"), slots=1)
    gw = Gateway(stack(text, "--simulate"))
    client = LeaseClient(f"http://127.0.0.1:{gw.port}", model=None)
    try:
        client.acquire(64 * MiB)
    except Refused as exc:
        reason = exc.reason
    else:
        raise AssertionError("a lease beyond the budget was granted")
    assert reason.startswith(f"lease needs {64 * MiB} bytes (0.06 GiB), ")
    # chat (priority 90) is idle and holds more than 64 MiB: a lease above its priority would evict it
    assert reason.endswith(
        "blocked by chat (priority 90 >= 50); at priority 91 it would be granted, evicting chat (this lease asked 50)"
    )
    hook = LeaseHook(client, resolver(models_dir(tmp_path)))
    out = hook.on_prompt({"prompt": WORKFLOW, "client_id": "c1"})
    node = out["prompt"]["umemc"]
    assert node["class_type"] == "UmemcRefused"
    message = node["inputs"]["reason"]
    assert message.startswith("umemc cannot give this workflow 2.0 GiB now: lease needs ")
    # 2 GiB is more than the whole budget: no priority would get it
    assert message.endswith(
        "blocked by chat (priority 90 >= 50); no priority would be granted now (this lease asked 50)"
    )
    assert UmemcRefused.VALIDATE_INPUTS(message) == message  # what ComfyUI shows as the prompt's error
    assert gw.call("GET", "/umemc/leases")[2]["leases"] == []


def test_an_unreachable_gateway_runs_the_prompt_without_a_lease(tmp_path: Path) -> None:
    from tests.runtime.conftest import free_port

    hook = LeaseHook(LeaseClient(f"http://127.0.0.1:{free_port()}", timeout_s=2), resolver(models_dir(tmp_path)))
    out = hook.on_prompt({"prompt": WORKFLOW})
    assert out["prompt"] == WORKFLOW and EXTRA not in out.get("extra_data", {})


def test_a_lease_that_names_its_worker_raises_that_workers_allowance(stack: Any, tmp_path: Path) -> None:
    """ComfyUI's lease is for memory ComfyUI itself will hold. Counted beside its quota, it was double (the
    ledger held quota + lease while the worker grew into the lease) and the enforcer still killed the worker at
    its old quota. Named with `worker`, it raises that worker's allowance: a real worker grows into the lease
    and lives, the ledger counts it once, the kernel limit grows with it, and the release takes it back."""
    import http.client
    import json as _json

    from tests.runtime.conftest import free_port, live_sysctl_table, worker

    port, gw_port = free_port(), free_port()
    text = (
        'version = 1\nname = "allow"\n[platform]\nkind = "cpu"\nmemory = "1280MiB"\nos_reserve = "256MiB"\n'
        "[policy]\nsafety_margin = 0.0\nquota_headroom = 0.25\nload_below = 0.99\nevict_above = 0.995\n"
        f"{live_sysctl_table()}[gateway]\nport = {gw_port}\n"
        + worker("comfy", "grower.py", "{port}", 40, memory="64MiB", port=port)  # hard quota 80 MiB
    )
    gw = Gateway(stack(text))
    hard = gw.plan["models"]["comfy"]["quota_hard_bytes"]
    client = LeaseClient(f"http://127.0.0.1:{gw.port}", model="comfy")
    lease = client.acquire(200 * MiB, holder="comfyui", ttl_s=600)
    [listed] = gw.call("GET", "/umemc/leases")[2]["leases"]
    assert (listed["id"], listed["worker"], listed["bytes"]) == (lease, "comfy", 200 * MiB)
    allowance = gw.run.wait_for(lambda: gw.run.events("allowance"), what="the enforcer to raise the allowance")
    assert allowance[-1]["detail"] == {"allowance_bytes": 200 * MiB, "hard_bytes": hard + 200 * MiB}
    cgroup = Path((gw.run.run_dir / "state" / "cgroups" / "comfy").read_text().split()[1])
    limit_file = next((cgroup / f for f in ("memory.max", "memory.limit_in_bytes") if (cgroup / f).exists()), None)
    if limit_file is not None:  # the kernel's limit too, where the worker has a cgroup
        assert int(limit_file.read_text()) == hard + 200 * MiB

    def grow(mib: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/grow?mib={mib}")
        return int(_json.loads(conn.getresponse().read())["held_mib"])

    pid = gw.run.status()["comfy"]["pid"]
    assert grow(150) == 190  # 190 MiB: far over its plain 80 MiB quota, within 80 + 200
    gw.run.wait_for(lambda: gw.run.status()["comfy"]["rss_bytes"] > 190 * MiB, what="the growth to be sampled")
    # counted once: the larger of its usage and its raised quota, not its quota beside the lease
    committed = gw.status()["budget"]["committed_bytes"]
    assert committed == hard + 200 * MiB
    assert gw.run.status()["comfy"]["pid"] == pid and not gw.run.events("hard_limit_kill")

    client.release(lease)  # the allowance goes back: the worker, still at 190 MiB, is over its plain quota
    kill = gw.run.wait_for(lambda: gw.run.events("hard_limit_kill"), what="the kill after the release")
    assert kill[0]["model"] == "comfy" and kill[0]["detail"]["hard_bytes"] == hard
