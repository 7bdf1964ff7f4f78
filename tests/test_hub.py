"""Models named on the Hugging Face Hub (`hf = …`): sized from their GGUF header before any download, pulled
with huggingface_hub (resume, every part of a split GGUF, the Hub's sha256 checked), recorded in the lock.

The Hub is tests/hubserver.FakeHub on loopback (HF_ENDPOINT), answering with the headers huggingface_hub
reads; the files it serves are real GGUFs written by the gguf package (tiny ones with weights, a sparse one of
a preset's full size). Expected figures come from umemc on the same file on disk, the file's own bytes
(sha256, equality), and llama.cpp loading what was pulled."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import patience
from tests.hubserver import FakeHub
from umemc.catalog.archs import LLM_PRESETS
from umemc.testing.sparsegguf import write_sparse_gguf
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

REPO = "acme/Tiny-GGUF"
FILE = "tiny-Q8_0.gguf"
MiB = 2**20


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hosted")
    split_dir = d / "split"
    split_dir.mkdir()
    return {
        "tiny": write_tiny_gguf(d / "tiny.gguf", TinySpec(n_layer=4, n_embd=256, n_ff=512, ftype="Q8_0")),
        # BGE-M3's shapes at full size (0.6 GB, sparse): a vocabulary of 250k tokens, a header past the first 4 MiB
        "wide": write_sparse_gguf(d / "bge-m3-Q8_0.gguf", LLM_PRESETS["bge-m3"], "Q8_0")[0],
        "split": write_tiny_gguf(
            split_dir / "tiny.gguf", TinySpec(n_layer=4, n_embd=256, n_ff=512), split_max_tensors=12
        ),
        "big": write_tiny_gguf(d / "big.gguf", TinySpec(n_layer=6, n_embd=1024, n_ff=2048, n_vocab=2000, ftype="F32")),
    }


@pytest.fixture
def hub(files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        h.add(REPO, FILE, files["tiny"])
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token stored by `hf auth login`
        yield h


def stack(tmp_path: Path, model: str = f'hf = "{REPO}/{FILE}"', extra: str = "") -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(
        'version = 1\nname = "hub"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.chat]\n'
        f'runtime = "llama-server"\n{model}\ncontext = 2048\n{extra}'
    )
    return path


def figures(doc: dict) -> dict:
    m = doc["models"]["chat"]
    return {k: m[k] for k in ("weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes", "estimate_bytes")}


def check_json(run_cli, path: Path) -> tuple[int, dict, str]:
    code, out, err = run_cli("check", str(path), "--format", "json")
    return code, (json.loads(out) if out else {}), err


def test_check_sizes_a_hub_model_from_its_header_alone(hub: FakeHub, files, tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path)
    code, doc, err = check_json(run_cli, path)
    assert code == 0
    size = files["tiny"].stat().st_size
    local = tmp_path / "models" / REPO / FILE
    assert err == (
        f"warning: {path}:8:6: models.chat.hf: not downloaded yet ({local}): sized from its GGUF header on the Hub "
        f"({REPO} at {'c0ffee' * 2}, {min(size, 4 * MiB) / MiB:.2f} MiB of {size / MiB:.2f} MiB read); "
        f"`umemc pull {path}` downloads it\n"
    )
    assert doc["models"]["chat"]["source"] == "lock"
    assert not local.exists() and not (tmp_path / "stack.calibration.json").exists()  # check writes nothing
    # the same figures as for the file itself on disk
    on_disk = stack(tmp_path / "d" if (tmp_path / "d").mkdir() is None else tmp_path, f'model = "{files["tiny"]}"')
    assert figures(doc) == figures(check_json(run_cli, on_disk)[1])
    cdn = [r for r in hub.requests if r.path.startswith("/cdn/")]
    assert [(r.method, r.range) for r in cdn] == [("GET", f"bytes=0-{size - 1}")]  # smaller than the first read
    assert hub.served() == size


def test_a_header_past_the_first_read_is_read_further(hub: FakeHub, files, tmp_path: Path, run_cli) -> None:
    hub.add(REPO, "wide.gguf", files["wide"])
    code, doc, _ = check_json(run_cli, stack(tmp_path, f'hf = "{REPO}/wide.gguf"'))
    assert code == 0
    ranges = [r.range for r in hub.requests if r.path.startswith("/cdn/")]
    assert ranges == [f"bytes=0-{4 * MiB - 1}", f"bytes=0-{16 * MiB - 1}"]
    assert hub.served() == 20 * MiB
    on_disk = stack(tmp_path / "d" if (tmp_path / "d").mkdir() is None else tmp_path, f'model = "{files["wide"]}"')
    assert figures(doc) == figures(check_json(run_cli, on_disk)[1])


def test_build_records_the_header_and_check_then_needs_no_hub(
    hub: FakeHub, tmp_path: Path, run_cli, monkeypatch
) -> None:
    path = stack(tmp_path)
    code, _, _ = run_cli("build", str(path), "-o", str(tmp_path / "out"), "--files-later")
    assert code == 0
    lock = json.loads((tmp_path / "stack.calibration.json").read_text())["models"]["chat"]
    hosted = hub.repos[REPO].files[FILE]
    assert lock["hub"] == {
        "repo": REPO, "path": FILE, "revision": "main", "commit": "c0ffee" * 6 + "c0ff",
        "parts": [{"path": FILE, "size": hosted.size, "sha256": hosted.sha256}], "header_bytes": hosted.size,
    }  # fmt: skip
    first = check_json(run_cli, path)[1]
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers there
    before = len(hub.requests)
    code, doc, _ = check_json(run_cli, path)
    assert code == 0 and figures(doc) == figures(first) and len(hub.requests) == before


def test_a_hub_that_cannot_answer_falls_back_or_says_what_to_do(
    hub: FakeHub, tmp_path: Path, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = stack(tmp_path)
    local = tmp_path / "models" / REPO / FILE
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"{path}:8:6: models.chat.hf: not downloaded yet ({local}), and the Hub could not size it: HF_HUB_OFFLINE "
        f'is set\n  hint: `umemc pull {path}` downloads it; or give arch = "<preset>" as a fallback, or memory = "…"\n'
    )
    path = stack(tmp_path, f'hf = "{REPO}/{FILE}"\narch = "llama-3-8b"')
    code, _, err = run_cli("check", str(path), "--format", "json")
    assert code == 0
    assert err.splitlines()[0] == (
        f"warning: {path}:8:6: models.chat.hf: not downloaded yet ({local}); the Hub could not size it: "
        'HF_HUB_OFFLINE is set; estimating from arch = "llama-3-8b"'
    )


@pytest.mark.parametrize(
    ("spelling", "message", "hint"),
    [
        ("no/such-repo/x.gguf", "no repository no/such-repo on {url} (or it is private: set HF_TOKEN)", None),
        (f"{REPO}/missing.gguf", f"{REPO} has no file missing.gguf at main", None),
    ],
)
def test_the_hubs_refusals_are_said(hub: FakeHub, tmp_path: Path, run_cli, spelling: str, message: str, hint) -> None:
    path = stack(tmp_path, f'hf = "{spelling}"')
    code, _, err = run_cli("check", str(path))
    assert code == 2
    assert err.splitlines()[0].endswith("and the Hub could not size it: " + message.format(url=hub.url))


def test_a_private_repository_needs_the_token(hub: FakeHub, tmp_path: Path, run_cli, monkeypatch) -> None:
    hub.token = "hf_secret"
    path = stack(tmp_path)
    code, _, err = run_cli("check", str(path))
    assert code == 2 and err.splitlines()[0].endswith(
        f"no repository {REPO} on {hub.url} (or it is private: set HF_TOKEN)"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert run_cli("check", str(path))[0] == 0
    assert {r.authorization for r in hub.requests if "/resolve/" in r.path} == {None, "Bearer hf_secret"}
    assert {r.authorization for r in hub.requests if r.path.startswith("/cdn/")} == {None}  # never sent off the Hub


@pytest.mark.parametrize(
    ("value", "message", "hint"),
    [
        ('hf = "https://huggingface.co/acme/x/resolve/main/a.gguf"', "names a repository and a file, not a URL",
         'e.g. hf = "unsloth/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf"'),
        ('hf = "acme/x"', "must be owner/repository/path of a file in it",
         'e.g. hf = "unsloth/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf"'),
        ('hf = "acme/x/../etc/passwd"', "bad path segment '..'", "a file's path in the repository, '/'-separated"),
        ('hf = "acme/x/m-00002-of-00003.gguf"', "names part 2 of a split GGUF",
         "name its first part: m-00001-of-00003.gguf"),
        ('hf = "acme/x/a.gguf"\nhf_revision = "../main"', "bad revision '../main'", "a branch, a tag or a commit hash"),
    ],
)  # fmt: skip
def test_bad_hub_spellings_are_located(tmp_path: Path, run_cli, value: str, message: str, hint: str) -> None:
    path = stack(tmp_path, value)
    code, out, err = run_cli("check", str(path))
    key = "hf_revision" if "hf_revision" in value else "hf"
    line, col = (9, 15) if key == "hf_revision" else (8, 6)
    assert (code, out) == (2, "")
    assert err == f"{path}:{line}:{col}: models.chat.{key}: {message}\n  hint: {hint}\n"


def test_pull_downloads_verifies_and_records(hub: FakeHub, files, tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path)
    code, out, _ = run_cli("pull", str(path), "--quiet")
    local = tmp_path / "models" / REPO / FILE
    size = files["tiny"].stat().st_size
    assert code == 0
    took = out.split(" in ")[1].split(" s,")[0]
    assert out == (
        f"chat: {REPO}/{FILE} at {'c0ffee' * 2} -> {local}: downloaded {size / MiB:.2f} MiB in {took} s, sha256 "
        f"verified\nrecorded in {tmp_path / 'stack.calibration.json'}\n"
    )
    assert local.read_bytes() == files["tiny"].read_bytes()
    lock = json.loads((tmp_path / "stack.calibration.json").read_text())["models"]["chat"]
    assert lock["file"] == {"size": size, "sha256_head": hashlib.sha256(local.read_bytes()[: 4 * MiB]).hexdigest()}
    assert lock["hub"]["commit"] == "c0ffee" * 6 + "c0ff"
    served = hub.served()
    code, out, _ = run_cli("pull", str(path), "--quiet")  # a second pull: nothing to download, nothing to hash
    assert code == 0 and out.startswith(
        f"chat: {REPO}/{FILE} at {'c0ffee' * 2} -> {local}: already here, sha256 verified at its download, size "
        "and mtime unchanged since (--verify hashes it again)\n"
    )
    assert hub.served() == served
    # altered with its size and mtime put back: only --verify, which hashes it again, can tell, and says so
    st = local.stat()
    data = bytearray(local.read_bytes())
    data[-1] ^= 0xFF
    local.write_bytes(bytes(data))
    os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out, err = run_cli("pull", str(path), "--quiet", "--verify")
    assert (code, out) == (1, "")
    assert err == (
        f"umemc pull: {local}: sha256 {hashlib.sha256(bytes(data)).hexdigest()} is not the Hub's "
        f"{sha256(files['tiny'])}: the file changed since it was verified; remove it and `umemc pull` downloads it "
        "again\n"
    )
    assert local.read_bytes() == bytes(data)  # refused, never removed: it is the user's file
    local.write_bytes(files["tiny"].read_bytes())  # put right, its mtime too: the record matches, the bytes too
    os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out, _ = run_cli("pull", str(path), "--quiet", "--verify")
    assert code == 0 and out.startswith(
        f"chat: {REPO}/{FILE} at {'c0ffee' * 2} -> {local}: already here, sha256 verified\n"
    )
    code, doc, err = check_json(run_cli, path)
    assert (code, err, doc["models"]["chat"]["source"]) == (0, "", "gguf")


def test_pull_fetches_every_part_of_a_split_gguf(hub: FakeHub, files, tmp_path: Path, run_cli) -> None:
    parts = sorted(files["split"].parent.glob("tiny-*.gguf"))
    for p in parts:
        hub.add("acme/Split-GGUF", f"Q8_0/{p.name}", p)
    path = stack(tmp_path, f'hf = "acme/Split-GGUF/Q8_0/{parts[0].name}"')
    code, doc, _ = check_json(run_cli, path)  # sized from the four headers before the download
    assert code == 0
    on_disk = stack(tmp_path / "d" if (tmp_path / "d").mkdir() is None else tmp_path, f'model = "{files["split"]}"')
    assert figures(doc) == figures(check_json(run_cli, on_disk)[1])
    code, out, _ = run_cli("pull", str(path), "--quiet")
    assert code == 0 and "(4 parts)" in out
    got = sorted((tmp_path / "models" / "acme" / "Split-GGUF" / "Q8_0").glob("tiny-*.gguf"))
    assert [p.name for p in got] == [p.name for p in parts]
    assert [sha256(p) for p in got] == [sha256(p) for p in parts]


def test_a_wrong_checksum_removes_the_file(hub: FakeHub, tmp_path: Path, run_cli) -> None:
    hosted = hub.repos[REPO].files[FILE]
    hosted.corrupt = True
    code, _, err = run_cli("pull", str(stack(tmp_path)), "--quiet")
    assert code == 1
    got = err.strip().split("sha256 ")[1].split(" ")[0]
    assert err.strip().endswith(
        f"umemc pull: {FILE}: sha256 {got} is not the Hub's {hosted.sha256}; the file was removed "
        "(`umemc pull` downloads it again)"
    )
    assert not (tmp_path / "models" / REPO / FILE).exists()


def test_an_interrupted_pull_resumes_where_it_stopped(hub: FakeHub, files, tmp_path: Path) -> None:
    """`umemc pull` killed with -9 mid-download: the next one asks only for the rest (a range request)."""
    hosted = hub.add(REPO, "big.gguf", files["big"])
    path = stack(tmp_path, f'hf = "{REPO}/big.gguf"')
    hub.stall_after = 12 * MiB
    pull = [sys.executable, "-m", "umemc", "pull", str(path), "--quiet"]
    partial = tmp_path / "models" / REPO / "big.gguf.part"
    proc = subprocess.Popen(pull, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert hub.stalled.wait(patience(60))
        deadline = time.monotonic() + patience(30)
        while (partial.stat().st_size if partial.exists() else 0) < 12 * MiB:  # what was sent has been written
            assert time.monotonic() < deadline, "the partial download was not written"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    hub.stall_after = None
    hub.go.set()
    # at least what was sent before the stall; more where the killed pull had retried a stalled read (its read
    # timeout) before the kill reached it, on a machine busy enough: then it ends where that retry's bytes end
    have = partial.stat().st_size
    assert 12 * MiB <= have < hosted.size
    before = len(hub.requests)
    done = subprocess.run(pull, capture_output=True, text=True, timeout=patience(120))
    assert done.returncode == 0, done.stderr
    assert sha256(tmp_path / "models" / REPO / "big.gguf") == hosted.sha256 and not partial.exists()
    again = [(r.range, r.sent) for r in hub.requests[before:] if r.path.startswith("/cdn/")]
    assert again == [(f"bytes={have}-", hosted.size - have)]


def test_pull_refuses_a_download_the_disk_cannot_hold(hub: FakeHub, files, tmp_path: Path, run_cli) -> None:
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (root is needed)")
    try:
        hub.add(REPO, "big.gguf", files["big"])
        path = stack(tmp_path, f'hf = "{REPO}/big.gguf"\nmodel = "small/big.gguf"')
        code, _, err = run_cli("pull", str(path), "--quiet")
        need = files["big"].stat().st_size
        assert code == 1
        assert err.strip().endswith(
            f"umemc pull: {REPO}/big.gguf needs {need / MiB:.2f} MiB at {small}; 1.00 MiB is free"
        )
    finally:
        subprocess.run(["umount", str(small)], check=True)
