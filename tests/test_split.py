"""A model split by layers across nodes (umemc.budget.split), on figures made by hand: ten blocks of 10 MiB of
weights and 1 MiB of KV cache each (one KV head of 64 dims, f16, 4096 cells: (128 + 128) bytes x 4096), token
embeddings and an output layer of 5 MiB each, a compute buffer of 2 MiB and a process of 3 MiB (an RPC server's:
8 MiB, and its receive buffer, the largest tensor it is sent: a block's 10 MiB). A part's hard quota is its estimate
x 1.1 rounded up to a MiB. The stack-level rules (which stacks may split,
and how a split is said) are at the end; tests/runtime/test_rpc_split.py runs one for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from umemc.budget.plan import hard_quota
from umemc.budget.split import Room, Serving, plan_split
from umemc.catalog.archs import LlmShape
from umemc.estimate.figures import Estimate, Figure
from umemc.estimate.gguf_file import GgufFacts

MiB = 2**20
N = 10


SERVING = Serving(context=4096, parallel=1, ubatch=512, kv_cache="f16", flash_attn=True)


def QUOTA(n: int) -> int:  # noqa: N802 - the stack's quota_headroom 0.1
    return hard_quota(n, 0.10)


def facts() -> GgufFacts:
    shape = LlmShape("llama", N, 64, 128, 1, (1,) * N, 64, 64, 320, 4096)
    return GgufFacts(
        path="hand.gguf", tensor_bytes=(10 * N + 5 + 5) * MiB, n_tensors=0, type_counts={}, file_type="F16",
        shape=shape, general_arch="llama", layer_bytes=(10 * MiB,) * N, layer_repack=(0,) * N,
        output_bytes=5 * MiB, tied=False,
    )  # fmt: skip


def whole() -> Estimate:
    zero = Figure("gpu", 0, "")
    return Estimate(
        "big", "gguf", Figure("weights", 110 * MiB, ""), Figure("kv", N * MiB, ""), Figure("compute", 2 * MiB, ""),
        Figure("overhead", 3 * MiB, ""), zero,
    )  # fmt: skip


def split(rooms: list[Room]):  # type: ignore[no-untyped-def]
    return plan_split("big", whole(), facts(), rooms, QUOTA, SERVING)


def parts(s) -> list[tuple[str, str, int, int]]:  # type: ignore[no-untyped-def]
    return [(p.node, p.holds, p.estimate.estimate_bytes // MiB, hard_quota(p.estimate.estimate_bytes, 0.10) // MiB)
            for p in s.parts]  # fmt: skip


def test_a_cpu_main_node_holds_the_first_blocks_and_the_last_helper_the_output() -> None:
    # a (64 MiB, first of three alike): 5 + 2 + 3 fixed, 4 blocks of 11: 54 MiB, 59.4 -> 60 hard (5 blocks: 65 -> 72)
    # one helper cannot hold the other 6 blocks (66 + 5 + 2 + 8 + 10 = 91 MiB); b: 2 + 8 + 10 fixed and 3 blocks:
    # 53 MiB, 58.3 -> 59 hard (4: 64 -> 71); c the last 3 blocks and the output: 33 + 5 + 20 = 58 MiB, 63.8 -> 64 hard
    rooms = [Room("a", 64 * MiB, None, "cpu", "10.0.0.1", 50052), Room("b", 64 * MiB, None, "cpu", "10.0.0.2", 50052),
             Room("c", 64 * MiB, None, "cpu", "10.0.0.3", 50060)]  # fmt: skip
    s = split(rooms)
    assert s is not None and s.main == "a" and not s.gpu_main
    assert parts(s) == [
        ("a", "blocks 0-3, the token embeddings", 54, 60),
        ("b", "blocks 4-6", 53, 59),
        ("c", "blocks 7-9, the output layer", 58, 64),
    ]
    # llama.cpp offloads the last 7 of its 11 layers (10 blocks and the output) to the RPC servers, 3 and 4 of them
    assert s.args() == ["--rpc", "10.0.0.2:50052,10.0.0.3:50060", "-ngl", "7", "--tensor-split", "3,4"]
    assert [p.estimate.kv.bytes // MiB for p in s.parts] == [4, 3, 3]


def test_llama_cpps_compute_buffer_per_device_replaces_the_models_where_it_was_asked() -> None:
    # the first test's rooms, with llama.cpp's dry run (helpers up) saying b's device needs 1 MiB of compute and the
    # main node 1.5 MiB: b holds 3 blocks at 33 + 1 + 8 + 10 = 52 MiB (57.2 -> 58 hard), a 5 + 44 + 1.5 + 3 = 53.5
    # MiB; c, not asked, keeps the model's 2 MiB: 33 + 5 + 2 + 8 + 10 = 58
    rooms = [Room("a", 64 * MiB, None, "cpu", "10.0.0.1", 50052), Room("b", 64 * MiB, None, "cpu", "10.0.0.2", 50052),
             Room("c", 64 * MiB, None, "cpu", "10.0.0.3", 50060)]  # fmt: skip
    s = plan_split(
        "big", whole(), facts(), rooms, QUOTA, SERVING,
        measured={"10.0.0.2:50052": MiB, "main": 3 * MiB // 2},
    )  # fmt: skip
    assert s is not None
    assert [(p.node, p.estimate.compute.bytes, p.estimate.estimate_bytes) for p in s.parts] == [
        ("a", 3 * MiB // 2, 53 * MiB + MiB // 2),
        ("b", MiB, 52 * MiB),
        ("c", 2 * MiB, 58 * MiB),
    ]
    assert s.parts[1].estimate.compute.formula.startswith("llama.cpp's dry run with the RPC servers")


def test_a_gpu_main_node_holds_the_last_blocks_and_the_output_on_its_gpu() -> None:
    # llama.cpp's devices: the RPC servers first, then the main node's GPU, which takes the last blocks and the output:
    # a (71 MiB): 4 blocks + output + embeddings (on its CPU) + 2 + 3: 59 MiB, 64.9 -> 65 hard (5 blocks: 70 -> 77);
    # c (59) the 3 blocks before, 33 + 2 + 8 + 10 = 53 MiB, 58.3 -> 59 hard; b the first 3 alike
    rooms = [
        Room("a", 71 * MiB, 71 * MiB, "amd-apu", "10.0.0.1", 50052),
        Room("b", 59 * MiB, None, "cpu", "10.0.0.2", 50052),
        Room("c", 59 * MiB, None, "cpu", "10.0.0.3", 50052),
    ]
    s = split(rooms)  # fmt: skip
    assert s is not None and s.main == "a" and s.gpu_main
    assert parts(s) == [
        ("b", "blocks 0-2", 53, 59),
        ("c", "blocks 3-5", 53, 59),
        ("a", "blocks 6-9, the token embeddings, the output layer", 59, 65),
    ]
    assert s.args() == ["--rpc", "10.0.0.2:50052,10.0.0.3:50052", "-ngl", "11", "--tensor-split", "3,3,5"]
    # on its GPU: its blocks, their KV, the output and the compute buffer; the token embeddings stay on its CPU
    assert s.main_part.estimate.gpu.bytes == (40 + 4 + 5 + 2) * MiB


def test_the_main_part_is_sized_as_its_own_nodes_kind_estimates_the_model() -> None:
    """The main node is a GPU node whose estimate of the model carries 5 MiB of process and driver context (the
    first allowed node's, a CPU's, 3 MiB): its part holds 4 blocks, the output and the embeddings at 40 + 4 + 5 + 5 +
    2 + 5 = 61 MiB (67.1 -> 68 hard; with the CPU's figure it would be 59)."""
    rooms = [
        Room("a", 71 * MiB, 71 * MiB, "amd-apu", "10.0.0.1", 50052),
        Room("b", 59 * MiB, None, "cpu", "10.0.0.2", 50052),
        Room("c", 59 * MiB, None, "cpu", "10.0.0.3", 50052),
    ]
    gpu = whole()
    on_a = Estimate(gpu.name, gpu.source, gpu.weights, gpu.kv, gpu.compute, Figure("overhead", 5 * MiB, ""), gpu.gpu)
    s = plan_split(
        "big", whole(), facts(), rooms, QUOTA, SERVING,
        on_node={"a": on_a, "b": whole(), "c": whole()},
    )  # fmt: skip
    assert s is not None
    assert (s.main_part.holds, s.main_part.estimate.estimate_bytes) == (
        "blocks 6-9, the token embeddings, the output layer",
        61 * MiB,
    )


def test_no_split_where_the_nodes_together_are_too_small() -> None:
    # the same as the first, with c 1 MiB short of its part's 53 MiB hard quota and b no larger
    rooms = [Room("a", 60 * MiB, None, "cpu", "10.0.0.1", 1), Room("b", 52 * MiB, None, "cpu", "10.0.0.2", 1),
             Room("c", 52 * MiB, None, "cpu", "10.0.0.3", 1)]  # fmt: skip
    assert split(rooms) is None


BAD = {
    "no nodes": (
        '[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.big]\nruntime = "llama-server"\narch = "llama-3-8b"\n'
        "split = true\n",
        "stack.toml:9:9: models.big.split: the stack has no [nodes]: there is nothing to split across\n"
        "  hint: remove it",
    ),
    "another runtime": (
        '[nodes.a]\nkind = "cpu"\nmemory = "8GiB"\n[nodes.b]\nkind = "cpu"\nmemory = "8GiB"\n[models.big]\n'
        'runtime = "llama-cpp-python"\narch = "llama-3-8b"\nsplit = true\n',
        'stack.toml:12:9: models.big.split: runtime = "llama-cpp-python" cannot be split: only llama-server runs '
        'llama.cpp\'s RPC backend\n  hint: remove split, or use runtime = "llama-server"',
    ),
    "cold": (
        '[nodes.a]\nkind = "cpu"\nmemory = "8GiB"\n[nodes.b]\nkind = "cpu"\nmemory = "8GiB"\n[models.big]\n'
        'runtime = "llama-server"\narch = "llama-3-8b"\nmode = "cold"\nsplit = true\n',
        "stack.toml:13:9: models.big.split: a split model is hot: its parts on the other nodes are held for as long "
        'as the stack runs\n  hint: set mode = "hot", or remove split',
    ),
    "one node": (
        '[nodes.a]\nkind = "cpu"\nmemory = "8GiB"\n[nodes.b]\nkind = "cpu"\nmemory = "8GiB"\n[models.big]\n'
        'runtime = "llama-server"\narch = "llama-3-8b"\nnode = "a"\nsplit = true\n',
        "stack.toml:13:9: models.big.split: it may run on one node only: a split needs two or more\n"
        "  hint: give nodes = [...]",
    ),
    "bad address": (
        '[nodes.a]\nkind = "cpu"\nmemory = "8GiB"\naddress = "10.0.0.1; rm -rf /"\n[nodes.b]\nkind = "cpu"\n'
        'memory = "8GiB"\n[models.big]\nruntime = "llama-server"\narch = "llama-3-8b"\n',
        'stack.toml:6:11: nodes.a.address: bad address "10.0.0.1; rm -rf /": not an IP address or a host name\n'
        '  hint: e.g. address = "10.0.0.2"',
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_what_cannot_be_split_is_said_at_its_key(case: str, write_stack, run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text, message = BAD[case]
    write_stack('version = 1\nname = "spread"\n' + text)
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (2, "", message + "\n")


def _split_stack(extra: str = "") -> str:
    from tests.realmodels import SMOLLM2

    if not SMOLLM2.is_file():
        pytest.skip("the real tiny models are not in .venv/models: python3 dev.py setup-models")
    return (
        'version = 1\nname = "spread"\n[nodes.a]\nkind = "cpu"\nmemory = "1GiB"\nos_reserve = "900MiB"\n'
        '[nodes.b]\nkind = "cpu"\nmemory = "1GiB"\nos_reserve = "900MiB"\nrpc_port = 50100\n[nodes.c]\nkind = "cpu"\n'
        f'memory = "1GiB"\nos_reserve = "900MiB"\nrpc_port = 50200\n[models.smol]\nruntime = "llama-server"\n'
        f'model = "{SMOLLM2}"\ncontext = 1024\nsplit = true\n{extra}'
    )


def test_a_split_in_a_cluster_needs_an_image_with_the_rpc_backend(write_stack, run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_stack(_split_stack())
    code, out, err = run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == (
        "stack.toml:21:9: models.smol.split: a split model's pods need llama.cpp built with its RPC backend "
        "(-DGGML_RPC=ON), which the official images are not: no image is named for it on a, b, c\n"
        '  hint: give image = "registry/llama.cpp:VERSION" (one built with -DGGML_RPC=ON), or the nodes\' '
        "images.llama-server\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_split_in_a_cluster_is_an_rpc_server_per_helper_node_reached_by_its_service(
    write_stack, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import json

    import yaml

    from tests.test_kubernetes import _strict_valid, docs, kustomize
    from umemc.budget.plan import make_plan
    from umemc.commands.build import build_kubernetes
    from umemc.stack.resolve import load_stack

    image = "registry.example/llama.cpp:server-rpc-b9426"
    stack = write_stack(_split_stack(f'image = "{image}"\n'))
    plan = make_plan(load_stack(stack))
    out = tmp_path / "out"
    build_kubernetes(plan, out)
    found = docs(out)
    _strict_valid(found)
    by = {(d["kind"], d["metadata"]["name"]): d for _, d in found}
    budget = json.loads((out / "budget.json").read_text())
    parts = {p["node"]: p for p in budget["models"]["smol"]["split"]}
    main = by[("Deployment", "smol")]["spec"]["template"]["spec"]["containers"][0]
    assert main["args"][main["args"].index("--rpc") + 1] == "smol-rpc-b:50100,smol-rpc-c:50200"
    assert main["resources"]["requests"]["memory"] == str(parts["a"]["estimate_bytes"])
    for node, port in (("b", 50100), ("c", 50200)):
        d = by[("Deployment", f"smol-rpc-{node}")]
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert (c["image"], c["command"], c["args"]) == (
            image,
            ["/app/ggml-rpc-server"],
            ["--host", "0.0.0.0", "--port", str(port)],
        )
        assert c["resources"]["requests"]["memory"] == str(parts[node]["estimate_bytes"])
        # no probes: the server serves one client at a time, so a probe would time out once the model is connected
        assert "livenessProbe" not in c and "readinessProbe" not in c
        # each part's own figures (the JSON's) are what its node enforces
        assert c["resources"]["limits"]["memory"] == str(parts[node]["quota_hard_bytes"])
        mine = parts[node]
        assert sum(mine[f"{k}_bytes"] for k in ("weights", "kv", "compute", "overhead")) == mine["estimate_bytes"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]
        assert by[("Service", f"smol-rpc-{node}")]["spec"]["ports"][0]["port"] == port
        # llama.cpp's RPC has no authentication: only the model's own pods may reach its parts
        policy = by[("NetworkPolicy", f"smol-rpc-{node}")]["spec"]
        model_pods = {"app.kubernetes.io/name": "smol", "app.kubernetes.io/instance": "spread"}
        assert policy["ingress"] == [
            {"from": [{"podSelector": {"matchLabels": model_pods}}], "ports": [{"port": "rpc"}]}
        ]
    resources = yaml.safe_load((out / "kubernetes" / "kustomization.yaml").read_text())["resources"]
    assert {"models/smol.yaml", "models/smol-rpc-b.yaml", "models/smol-rpc-c.yaml"} <= set(resources)
    assert {("Deployment", f"smol-rpc-{n}") for n in "bc"} <= {
        (d["kind"], d["metadata"]["name"]) for d in kustomize(out / "kubernetes")
    }


def test_a_helper_node_without_the_rpc_server_is_refused_before_anything_starts(  # type: ignore[no-untyped-def]
    write_stack, run_cli, tmp_path: Path
) -> None:
    import shutil

    from tests.realmodels import LLAMA_SERVER

    alone = tmp_path / "bin"
    alone.mkdir()
    if not Path(LLAMA_SERVER).is_file():
        pytest.skip(f"no llama-server at {LLAMA_SERVER}: python3 dev.py setup-llama-server")
    shutil.copy(LLAMA_SERVER, alone / "llama-server")
    write_stack(_split_stack(f'bin = "{alone / "llama-server"}"\n'))
    code, out, _ = run_cli("up", "stack.toml", "--node", "b", "--run-dir", str(tmp_path / "run"), "--skip", "sysctl",
                           cwd=tmp_path)  # fmt: skip
    assert code == 1
    assert (
        f"    FAIL  executables: models.smol.split: the RPC server of its part on this node: "
        f"{alone / 'ggml-rpc-server'} not found\n"
    ) in out
    fix = (
        ": build llama.cpp with its RPC backend (cmake -DGGML_RPC=ON): ggml-rpc-server goes beside llama-server (the "
        "model's bin), else on PATH\n"
    )
    assert fix in out
    assert not (tmp_path / "run" / "state" / "supervisor.sock").exists()


def test_a_split_models_own_warnings_are_said(write_stack, run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Its whole figures are in no node's plan (each has its part): what its estimate warns of is said all the same."""
    write_stack(_split_stack('quant = "Q8_0"\n'))
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert code == 0
    said = 'stack.toml:22:9: models.smol.quant: quant = "Q8_0" but the file is Q4_1; the estimate uses the file'
    assert f"warning: {said}\n" in out + err


def test_a_middle_helper_leaves_the_last_one_a_block_and_the_roomiest_node_leads() -> None:
    """b (100 MiB) is the roomiest: it leads, holding 7 blocks (10 + 77 = 87 MiB, 95.7 -> 96 hard; 8: 98 -> 108).
    a (60) could hold all 3 blocks left (20 + 33 = 53, 58.3 -> 59 hard), which would leave c, the last, none; it holds
    2, and c the last block and the output layer: 11 + 5 + 20 = 36 MiB, 39.6 -> 40 hard, c's room. Filling a with all
    it could hold made this split look impossible with b leading (and c, the smallest, was made the main node)."""
    rooms = [Room("a", 60 * MiB, None, "cpu", "10.0.0.1", 50052), Room("b", 100 * MiB, None, "cpu", "10.0.0.2", 50052),
             Room("c", 40 * MiB, None, "cpu", "10.0.0.3", 50052)]  # fmt: skip
    s = split(rooms)
    assert s is not None and s.main == "b"
    assert parts(s) == [
        ("b", "blocks 0-6, the token embeddings", 87, 96),
        ("a", "blocks 7-8", 42, 47),
        ("c", "block 9, the output layer", 36, 40),
    ]
    # each helper counts the largest message it is sent while its part loads: a block here (10 MiB)
    assert [x.bytes for p in s.helpers for x in p.estimate.overhead.parts] == [8 * MiB, 10 * MiB] * 2


RPC_CASES = {
    # b and c on one host (every node's default: 127.0.0.1), both RPC servers on 50100
    "two RPC servers on one port": (
        ("rpc_port = 50200", "rpc_port = 50100"),
        "stack.toml:16:12: nodes.c.rpc_port: the RPC server of smol's part on node c would listen on "
        "127.0.0.1:50100, where the RPC server of smol's part on node b listens\n"
        "  hint: give nodes.c.rpc_port a port nothing else on 127.0.0.1 uses (each RPC server of a node takes the "
        "next port up)\n",
    ),
    "an RPC server on the gateway's port": (
        ("rpc_port = 50100", "rpc_port = 10000"),
        "stack.toml:11:12: nodes.b.rpc_port: the RPC server of smol's part on node b would listen on "
        "127.0.0.1:10000, where the gateway (every node runs one) listens\n"
        "  hint: give nodes.b.rpc_port a port nothing else on 127.0.0.1 uses (each RPC server of a node takes the "
        "next port up)\n",
    ),
    "any address": (
        ("[nodes.b]\n", '[nodes.b]\naddress = "0.0.0.0"\n'),
        'stack.toml:8:11: nodes.b.address: "0.0.0.0" is no address another node can reach (it means any of this '
        "node's)\n  hint: give the address the other nodes reach this node at, e.g. 10.0.0.2\n",
    ),
    "any IPv6 address": (
        ("[nodes.b]\n", '[nodes.b]\naddress = "::"\n'),
        'stack.toml:8:11: nodes.b.address: "::" is no address another node can reach (it means any of this '
        "node's)\n  hint: give the address the other nodes reach this node at, e.g. 10.0.0.2\n",
    ),
}


@pytest.mark.parametrize("case", sorted(RPC_CASES))
def test_where_an_rpc_server_listens_is_checked(case: str, write_stack, run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp's RPC servers have no authentication and take the port they are given: two on one host and port,
    one on a port something else of that host listens on, or on "any" address are refused at the key."""
    (old, new), said = RPC_CASES[case]
    text = _split_stack()
    assert old in text
    write_stack(text.replace(old, new, 1))
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (2, "", said)


def test_an_rpc_server_beyond_loopback_is_warned_at_its_address(write_stack, run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_stack(_split_stack().replace("[nodes.b]\n", '[nodes.b]\naddress = "10.0.0.2"\n', 1))
    code, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    assert (
        "warning: stack.toml:8:11: nodes.b.address: the RPC server of smol's part on node b listens on "
        "10.0.0.2:50100 beyond this machine, and llama.cpp's RPC protocol has no authentication (whoever reaches it "
        "can read and write its memory): keep that address on a private network, or a firewall's list of the other "
        "nodes\n"
    ) in err
    assert "nodes.c.address" not in err  # c listens on loopback


def test_a_mapped_main_node_holds_the_range_its_tensors_span() -> None:
    """With mmap, llama.cpp maps the file from the main node's first CPU tensor to its last, and reads the other
    devices' tensors in between through that map: here the file lists blk.9 between blk.0 and blk.1 (files order
    their tensors as they like), so a, holding blocks 0-3, maps blk.9's 10 MiB too: 54 + 10 = 64 MiB (70.4 -> 71
    hard). b: 4 blocks, 20 + 44 = 64 MiB; c: 2 blocks and the output, 22 + 5 + 20 = 47 MiB (51.7 -> 52)."""
    order = [0, 9, 1, 2, 3, 4, 5, 6, 7, 8]  # where each block lies in the file, after the 5 MiB of token embeddings
    spans = {b: ((5 + 10 * at) * MiB, (15 + 10 * at) * MiB) for at, b in enumerate(order)}
    laid = facts()._replace(layer_spans=tuple(spans[i] for i in range(N)), input_span=(0, 5 * MiB))
    rooms = [Room(n, 71 * MiB, None, "cpu", f"10.0.0.{i}", 50052) for i, n in enumerate("abc", 1)]

    def plan(mmap: bool):  # type: ignore[no-untyped-def]
        return plan_split("big", whole(), laid, rooms, QUOTA, SERVING._replace(mmap=mmap))

    s = plan(True)
    assert s is not None and parts(s) == [
        ("a", "blocks 0-3, the token embeddings", 64, 71),
        ("b", "blocks 4-7", 64, 71),
        ("c", "blocks 8-9, the output layer", 47, 52),
    ]
    assert [(x.name, x.bytes // MiB) for x in s.main_part.estimate.weights.parts] == [
        ("blocks", 40),
        ("token embeddings", 5),
        ("mapped between", 10),
    ]
    read = plan(False)  # read into its own buffers: its tensors only
    assert read is not None and read.main_part.estimate.estimate_bytes == 54 * MiB


def test_a_part_holds_a_gpu_device_where_its_pod_needs_one() -> None:
    """g, the roomiest, is a GPU node whose one device another model's pod already holds: no part goes there (its pod
    would wait for the device for ever), and the three CPU nodes split the model as in the first test; with the
    device free, g leads."""
    cpus = [Room(n, 64 * MiB, None, "cpu", f"10.0.0.{i}", 50052) for i, n in enumerate("abc", 1)]
    taken = Room("g", 200 * MiB, 200 * MiB, "amd-apu", "10.0.0.9", 50052, devices=0)
    s = split([taken, *cpus])
    assert s is not None and [p.node for p in s.parts] == ["a", "b", "c"]
    s = split([taken._replace(devices=1), *cpus])
    assert s is not None and s.main == "g"


def test_a_model_named_as_a_parts_pods_is_refused_in_a_cluster(write_stack, run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = '\n[models.smol-rpc-b]\nruntime = "command"\ncommand = ["true"]\nmemory = "8MiB"\nnode = "c"\n'
    stack = _split_stack('image = "registry.example/llama.cpp:server-rpc-b9426"\n') + other
    write_stack(stack)
    code, out, err = run_cli("build", "stack.toml", "--target", "kubernetes", "-o", "out", cwd=tmp_path)
    line = stack.splitlines().index("[models.smol-rpc-b]") + 1
    assert (code, out, err) == (
        2,
        "",
        f"stack.toml:{line}:1: models.smol-rpc-b: its pods would be named smol-rpc-b, as the RPC server of smol's part "
        "on node b is\n  hint: rename the model smol-rpc-b\n",
    )
    assert not (tmp_path / "out").exists()
