"""llama.cpp's own dry run (umemc.estimate.dryrun) against llama.cpp's real load of the same file with the same argv.

The model is a small Falcon-H1 (every layer attends and recurs: the architecture umemc's hand model used to miss
low) laid out by llama.cpp's loader (umemc.testing.discover) and written by the gguf package; the llama-server
and llama-fit-params are the ones `python3 dev.py setup-llama-server` builds from the llama.cpp llama-cpp-python
vendors. Expected figures are llama-server's own buffer lines from a real start, never umemc's."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader

from tests.runtime.conftest import free_port
from umemc.lockfile import totals
from umemc.runtime.llamalog import parse_buffers
from umemc.testing.discover import ArchSpec, discover, write_discovered

REPO = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("UMEMC_LLAMA_SERVER") or str(REPO / ".venv" / "llama-server" / "bin" / "llama-server")
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
pytestmark = [
    pytest.mark.llama_server,
    pytest.mark.skipif(
        not (Path(BINARY).is_file() or shutil.which(BINARY)),
        reason=f"no llama-server at {BINARY}: python3 dev.py setup-llama-server (or set UMEMC_LLAMA_SERVER)",
    ),
    pytest.mark.skipif(
        not HAVE_LLAMA_CPP, reason="llama-cpp-python lays out the test model: python3 dev.py setup-llama"
    ),
]
MiB = 2**20
FALCON = ArchSpec(
    "tiny-falcon-h1", "falcon-h1",
    {
        "context_length": 8192, "embedding_length": 1024, "block_count": 4, "feed_forward_length": 2048,
        "attention.head_count": 8, "attention.head_count_kv": 2, "attention.key_length": 128,
        "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e6,
        "ssm.conv_kernel": 4, "ssm.inner_size": 2048, "ssm.state_size": 64, "ssm.time_step_rank": 16,
        "ssm.group_count": 1,
    },
    4096, "a small model of the architecture",
    optional=("output.weight", "blk.N.ssm_conv1d.bias", "blk.N.ssm_norm.weight"),
)  # fmt: skip


@pytest.fixture(scope="module")
def falcon(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("falcon")
    return write_discovered(d / "falcon.gguf", FALCON, discover(FALCON, d, sys.executable), "Q8_0")


def stack(tmp_path: Path, model: Path, *, context: int = 2048, parallel: int = 2, bin: str = BINARY,
          runtime: str = "llama-server") -> Path:  # fmt: skip
    path = tmp_path / "stack.toml"
    binary = f'bin = "{bin}"\n' if runtime == "llama-server" else ""
    path.write_text(
        f'version = 1\nname = "dry"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.m]\nruntime = "{runtime}"\n'
        f'{binary}model = "{model}"\ncontext = {context}\nparallel = {parallel}\nmmap = false\nport = {free_port()}\n'
    )
    return path


def real_load(stack_path: Path, tmp_path: Path) -> dict[str, int]:
    """llama-server started with the argv umemc compiles, its buffer lines read once it listens, stopped by pid."""
    from umemc.budget.plan import make_plan
    from umemc.compile.bundle import compile_bundle
    from umemc.stack.resolve import load_stack

    plan = make_plan(load_stack(stack_path, locks={}))
    argv = [a.replace("@UMEMC_STATE@", str(tmp_path)) for a in compile_bundle(plan).programs["m"].argv]
    (tmp_path / "slots" / "m").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None and "listening on" not in log.read_text(errors="replace"):
                time.sleep(0.05)  # its log is the event: nothing to wait for but the line
        finally:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert "listening on" in text, text[-2000:]
    return totals(parse_buffers(text))


def report(run_cli: Any, tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    code, out, err = run_cli("check", "stack.toml", "--format", "json", *args, cwd=tmp_path)
    assert code == 0, err
    return json.loads(out)["models"]["m"], err


def test_check_measure_asks_llama_server_and_equals_its_load(falcon: Path, tmp_path: Path, run_cli: Any) -> None:
    stack(tmp_path, falcon)
    hand, _ = report(run_cli, tmp_path)
    assert hand["source"] == "gguf"
    asked, err = report(run_cli, tmp_path, "--measure")
    assert asked["source"] == "llama.cpp"
    assert "llama.cpp sized m (llama-server " in err
    real = real_load(tmp_path / "stack.toml", tmp_path)
    # llama.cpp prints its buffers with two decimals of MiB: equal to that
    assert abs(asked["weights_bytes"] - real["model"]) <= 0.005 * MiB
    assert abs(asked["kv_bytes"] - real["kv"]) <= 0.01 * MiB  # KV cache + recurrent state, two lines
    assert abs(asked["compute_bytes"] - (real["compute"] + real["output"])) <= 0.01 * MiB

    lock = json.loads((tmp_path / "stack.calibration.json").read_text())["models"]["m"]
    run = lock["dry_run"]
    assert run["tool"] == "llama-server"
    assert run["argv"][0] == str(Path(BINARY).resolve())
    assert run["argv"][-7:] == ["--fit", "on", "-v", "--host", "127.0.0.1", "--port", "0"]
    # what it read: at least the header (the tensor data begins at the GGUF's data offset, read here by the gguf
    # package). Not bounded above here: llama-server goes on to its real load once it has answered, and on a machine
    # as busy as CI's umemc may stop it only after that load has read some of the weights (21 of 74 MB once, under a
    # CPU hog on both cores). That the answer needs no weight is shown where there are none to read:
    # test_a_hub_model_is_asked_on_its_header_before_it_is_downloaded (a sparse copy, 4 MiB read from the Hub)
    assert run["read_bytes"] >= GGUFReader(falcon).data_offset
    # a later check reads the answer and asks nothing
    again, err = report(run_cli, tmp_path)
    assert again == asked and "sized" not in err
    assert json.loads((tmp_path / "stack.calibration.json").read_text())["models"]["m"]["dry_run"]["at"] == run["at"]


def test_a_changed_flag_or_binary_falls_back_to_the_estimate(falcon: Path, tmp_path: Path, run_cli: Any) -> None:
    copy = tmp_path / "bin" / "llama-server"
    copy.parent.mkdir()
    shutil.copy2(Path(BINARY).resolve(), copy)
    stack(tmp_path, falcon, bin=str(copy))
    assert report(run_cli, tmp_path, "--measure")[0]["source"] == "llama.cpp"

    stack(tmp_path, falcon, bin=str(copy), context=4096)
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert json.loads(out)["models"]["m"]["source"] == "gguf"
    assert (
        "stack.toml:6:1: models.m: llama.cpp's dry run no longer applies (context 2048 -> 4096): estimating; "
        "`umemc check --measure` asks it again"
    ) in err

    stack(tmp_path, falcon, bin=str(copy))
    os.utime(copy, ns=(0, 0))  # another build in its place
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert json.loads(out)["models"]["m"]["source"] == "gguf"
    assert (
        f"stack.toml:6:1: models.m: the llama.cpp that sized this model changed or is not the one it would run now "
        f"({copy}): estimating; `umemc check --measure` asks it again"
    ) in err


def test_build_asks_where_nothing_is_recorded(falcon: Path, tmp_path: Path, run_cli: Any) -> None:
    stack(tmp_path, falcon)
    code, _, err = run_cli("build", "stack.toml", "-o", str(tmp_path / "b1"), "--no-measure", cwd=tmp_path)
    assert code == 0 and not (tmp_path / "stack.calibration.json").exists()
    code, _, err = run_cli("build", "stack.toml", "-o", str(tmp_path / "b2"), cwd=tmp_path)
    assert code == 0 and "llama.cpp sized m" in err
    budget = json.loads((tmp_path / "b2" / "budget.json").read_text())
    assert budget["models"]["m"]["source"] == "llama.cpp"
    code, _, err = run_cli("build", "stack.toml", "-o", str(tmp_path / "b3"), cwd=tmp_path)
    assert code == 0 and "sized" not in err  # recorded and still valid: not asked again


def test_llama_fit_params_agrees_on_weights_and_kv(falcon: Path, tmp_path: Path) -> None:
    """Beside a llama-server without --fit, llama-fit-params answers with llama.cpp's generic context settings:
    the same weights and KV; its compute reserves logits for the whole ubatch (the server one row per sequence),
    so it is never below the server's."""
    from umemc.estimate.dryrun import FIT_PARAMS, Tool, run
    from umemc.lockfile import tool_identity

    fit = Path(BINARY).resolve().parent / "llama-fit-params"
    ident = tool_identity(fit)
    assert ident is not None, f"no {fit}: python3 dev.py setup-llama-server builds it"
    args = ["-m", str(falcon), "-c", "4096", "-np", "2", "-ub", "512", "-b", "2048", "-fa", "on", "-ctk", "f16",
            "-ctv", "f16", "-ngl", "0", "--load-mode", "none"]  # fmt: skip
    answer = run(Tool(FIT_PARAMS, str(fit), ident), args, {})
    real = real_load(stack(tmp_path, falcon), tmp_path)
    got = totals(answer.buffers)
    assert abs(got["kv"] - real["kv"]) <= 0.01 * MiB
    assert answer.table["Host"]["model"] == real["model"] // MiB * MiB  # the breakdown table: whole MiB
    assert got["compute"] >= real["compute"]


@pytest.mark.llama
def test_llama_cpp_python_dry_run_equals_its_load(falcon: Path, tmp_path: Path, run_cli: Any) -> None:
    from umemc.budget.plan import make_plan
    from umemc.compile.bundle import compile_bundle
    from umemc.runtime.measure import measure
    from umemc.stack.resolve import load_stack

    stack(tmp_path, falcon, runtime="llama-cpp-python", parallel=1)
    asked, err = report(run_cli, tmp_path, "--measure")
    assert asked["source"] == "llama.cpp" and "llama-cpp-python" in err
    plan = make_plan(load_stack(tmp_path / "stack.toml", locks={}))
    real = totals(measure(compile_bundle(plan).programs["m"], plan.models["m"].estimate.facts, 300).buffers)
    assert abs(asked["weights_bytes"] - real["model"]) <= 0.005 * MiB
    assert abs(asked["kv_bytes"] - real["kv"]) <= 0.01 * MiB
    assert abs(asked["compute_bytes"] - (real["compute"] + real["output"])) <= 0.01 * MiB


def test_a_hub_model_is_asked_on_its_header_before_it_is_downloaded(
    falcon: Path, tmp_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check --measure` on a model named on the Hub and not downloaded: llama.cpp sizes the sparse copy of its
    header (a few MB read from the Hub) and answers as for the file itself."""
    from tests.hubserver import FakeHub

    local = tmp_path / "local"
    local.mkdir()
    stack(local, falcon)
    on_disk, _ = report(run_cli, local, "--measure")
    with FakeHub() as hub:
        hub.add("acme/Falcon-H1-GGUF", "falcon.gguf", falcon)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
        (tmp_path / "stack.toml").write_text(
            (local / "stack.toml").read_text().replace(f'model = "{falcon}"', 'hf = "acme/Falcon-H1-GGUF/falcon.gguf"')
        )
        asked, err = report(run_cli, tmp_path, "--measure")
        served = hub.served()
    assert asked["source"] == "llama.cpp" and "llama.cpp sized m (llama-server " in err
    figures = ("weights_bytes", "kv_bytes", "compute_bytes", "estimate_bytes")
    assert {k: asked[k] for k in figures} == {k: on_disk[k] for k in figures}
    assert served == 4 * MiB and falcon.stat().st_size > 16 * served  # the header's first read, not the weights
    assert not (tmp_path / "models").exists()  # nothing downloaded


def _set_compute(tmp_path: Path, compute: int) -> None:
    """The recorded dry run's compute buffer set to `compute` bytes, its output buffer to nothing: what llama.cpp
    answers for an architecture umemc's hand model over-counts (the issue's: up to 112% over)."""
    path = tmp_path / "stack.calibration.json"
    doc = json.loads(path.read_text())
    buffers = doc["models"]["m"]["dry_run"]["buffers"]
    for b in buffers.values():
        b.pop("compute", None)
        b.pop("output", None)
    buffers["CPU"]["compute"] = compute
    path.write_text(json.dumps(doc))


def test_llama_cpps_own_answer_is_never_overruled_by_the_hand_model(falcon: Path, tmp_path: Path, run_cli) -> None:
    """The dry run of the llama.cpp on this machine, unchanged, on this file with these flags, is its truth: a
    compute figure under half of umemc's hand model (the old bound, which threw away 4 of 25 correct answers) is
    used as it is; only one under a single row of logits (the falcon's 4096 tokens x 4 bytes) is refused, said."""
    stack(tmp_path, falcon)
    hand, _ = report(run_cli, tmp_path)
    report(run_cli, tmp_path, "--measure")
    low = hand["compute_bytes"] // 3
    _set_compute(tmp_path, low)
    asked, err = report(run_cli, tmp_path)
    assert (asked["source"], asked["compute_bytes"], err) == ("llama.cpp", low, "")
    _set_compute(tmp_path, 4096 * 4 - 1)
    asked, err = report(run_cli, tmp_path)
    assert (asked["source"], asked["compute_bytes"]) == ("gguf", hand["compute_bytes"])
    # said, and umemc's own figures used, with what is uncertain in them
    assert err == (
        "warning: stack.toml:6:1: models.m: stack.calibration.json: the llama.cpp dry run compute buffer of 16383 "
        "bytes is below one row of logits: the 16384 bytes its header's shape needs: not used (a stale or forged "
        "record); `umemc check --measure` asks llama.cpp again\n"
        "warning: stack.toml:9:9: models.m.model: umemc sizes 'falcon-h1''s KV cache and recurrent state by "
        "llama.cpp's rules, but not its compute graph: compute follows the generic rules and may be off by tens of "
        "percent; `umemc check --measure` asks llama.cpp itself\n"
    )


def test_a_dry_run_of_a_llama_cpp_not_here_is_still_held_to_the_hand_model(
    falcon: Path, tmp_path: Path, run_cli
) -> None:
    """A record of a llama.cpp this machine does not have (a lock from elsewhere) is unverified: there the hand
    model's half stays the defence."""
    copy = tmp_path / "bin" / "llama-server"
    copy.parent.mkdir()
    shutil.copy2(Path(BINARY).resolve(), copy)
    stack(tmp_path, falcon, bin=str(copy))
    hand, _ = report(run_cli, tmp_path)
    report(run_cli, tmp_path, "--measure")
    _set_compute(tmp_path, hand["compute_bytes"] // 3)
    copy.unlink()  # the llama.cpp that answered is not on this machine now
    asked, err = report(run_cli, tmp_path)
    assert (asked["source"], asked["compute_bytes"]) == ("gguf", hand["compute_bytes"])
    assert (
        f"stack.calibration.json: the llama.cpp dry run compute buffer of {hand['compute_bytes'] // 3} bytes is below "
        f"half the {hand['compute_bytes']} bytes its header's shape needs: not used"
    ) in err


EMBEDDING_GEMMA = ArchSpec(
    "tiny-embeddinggemma", "gemma-embedding",
    {
        "context_length": 2048, "embedding_length": 768, "block_count": 6, "feed_forward_length": 1152,
        "attention.head_count": 3, "attention.head_count_kv": 1, "attention.key_length": 256,
        "attention.value_length": 256, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6,
        "attention.sliding_window": 512, "pooling_type": 1,
    },
    4096, "EmbeddingGemma's widths, six layers (five slide, one does not)", optional=(),
)  # fmt: skip


def test_an_encoder_umemc_took_for_a_decoder_keeps_llama_cpps_kv_cache_of_nothing(tmp_path: Path, run_cli) -> None:
    """EmbeddingGemma is an encoder: llama.cpp keeps no KV cache for it (llama_model::create_memory). Its dry run
    says KV 0, and that answer is used, never held to a hand model's cache; the hand estimate, too, counts none, and
    its compute (two masks over the batch, the gated FFN) comes to what llama.cpp reserves."""
    path = write_discovered(
        tmp_path / "eg.gguf", EMBEDDING_GEMMA, discover(EMBEDDING_GEMMA, tmp_path, sys.executable), "Q8_0"
    )
    stack(tmp_path, path, context=512, parallel=1)
    hand, _ = report(run_cli, tmp_path)
    asked, err = report(run_cli, tmp_path, "--measure")
    assert (asked["source"], asked["kv_bytes"], hand["kv_bytes"]) == ("llama.cpp", 0, 0)
    assert "not used" not in err
    assert abs(hand["compute_bytes"] - asked["compute_bytes"]) <= 0.02 * MiB, (hand, asked)


def test_a_trusted_dry_runs_kv_cache_is_not_held_to_the_hand_model(falcon: Path, tmp_path: Path, run_cli) -> None:
    """A KV cache llama.cpp on this machine answered, whatever umemc's own rules say the header needs, is used; a
    record of a llama.cpp not here is still held to 90% of the hand model's."""
    stack(tmp_path, falcon)
    hand, _ = report(run_cli, tmp_path)
    report(run_cli, tmp_path, "--measure")
    path = tmp_path / "stack.calibration.json"
    doc = json.loads(path.read_text())
    cpu = doc["models"]["m"]["dry_run"]["buffers"]["CPU"]
    cpu["kv"] = hand["kv_bytes"] // 2
    path.write_text(json.dumps(doc))
    asked, err = report(run_cli, tmp_path)
    # the KV figure is the cache as recorded and the recurrent state (RS) beside it
    assert (asked["source"], asked["kv_bytes"], err) == ("llama.cpp", hand["kv_bytes"] // 2 + cpu["rs"], "")
