"""A vLLM or MLX model named by its Hub repository (`hf = "owner/name"`): sized from its files' headers before any
download (config.json and the index whole, of each shard only its safetensors header, by range requests), pulled
whole into MODELS_DIR/owner/name with the Hub's sha256 checked. The Hub is tests/hubserver.FakeHub on loopback;
the directory it serves is written by the safetensors library (tests/engines/test_sizing.model_dir), and the
expected figures are numpy's own byte counts and the directory's bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines.test_sizing import model_dir
from tests.hubserver import FakeHub

REPO = "acme/Tiny-Llama"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeHub, Path, int]]:
    hosted, nbytes = model_dir(tmp_path / "hosted", shards=2)
    (hosted / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with FakeHub() as h:
        for f in sorted(hosted.iterdir()):
            h.add(REPO, f.name, f)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        yield h, hosted, nbytes


def stack(tmp_path: Path, runtime: str = "vllm", extra: str = "") -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(
        'version = 1\nname = "hubdir"\nmodels_dir = "models"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n'
        f'[models.chat]\nruntime = "{runtime}"\nhf = "{REPO}"\ncontext = 1000\n{extra}'
    )
    return path


def test_a_hub_directory_is_sized_from_its_headers_before_download(hub, tmp_path: Path, run_cli) -> None:
    h, hosted, nbytes = hub
    path = stack(tmp_path)
    code, out, err = run_cli("check", str(path), "--format", "json")
    assert code == 0, err
    chat = json.loads(out)["models"]["chat"]
    assert (chat["source"], chat["weights_bytes"]) == ("safetensors", nbytes)
    size = sum(f.stat().st_size for f in hosted.glob("*") if f.name != "tokenizer.json")
    assert err == (
        f"warning: {path}:9:6: models.chat.hf: not downloaded yet ({tmp_path / 'models' / REPO}): sized from its "
        f"files' headers on the Hub ({REPO} at c0ffeec0ffee, {size} bytes); `umemc pull` downloads it\n"
    )
    # config.json and the index whole; of each shard one first read of 64 KiB (its header is in it), no more
    small = sum(f.stat().st_size for f in hosted.glob("*.json") if f.name != "tokenizer.json")
    shards = [f.stat().st_size for f in hosted.glob("*.safetensors")]
    assert h.served() == small + sum(min(n, 65536) for n in shards)
    assert not (tmp_path / "models").exists()


def test_pull_downloads_the_directory_and_check_then_reads_it(hub, tmp_path: Path, run_cli) -> None:
    _, hosted, nbytes = hub
    path = stack(tmp_path, "mlx")
    code, out, err = run_cli("pull", str(path))
    assert code == 0, err
    dest = tmp_path / "models" / REPO
    # every file, and pull's own record of what it verified (a later pull trusts a file whose size and mtime held)
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [".umemc-verified.json", *(p.name for p in hosted.iterdir())]
    )
    for f in hosted.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes()
    assert f"chat: {REPO} (5 files) at c0ffeec0ffee -> {dest}: downloaded" in out
    code, out, err = run_cli("check", str(path), "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out)["models"]["chat"]["weights_bytes"] == nbytes


def test_a_repository_that_is_no_model_directory_is_said(hub, tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path)
    path.write_text(path.read_text().replace(REPO, "acme/Other"))
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"{path}:9:6: models.chat.hf: not downloaded yet ({tmp_path / 'models' / 'acme' / 'Other'}), and the Hub "
        f"could not size it: no repository acme/Other on {hub[0].url} (or it is private: set HF_TOKEN)\n"
        "  hint: `umemc pull` downloads it, or give memory\n"
    )


def test_hf_for_an_engine_names_a_repository(tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path)
    path.write_text(path.read_text().replace(f'hf = "{REPO}"', f'hf = "{REPO}/model.safetensors"'))
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"{path}:9:6: models.chat.hf: must be owner/repository (a model directory: vLLM and MLX load a whole "
        'repository)\n  hint: e.g. hf = "HuggingFaceTB/SmolLM2-135M-Instruct"\n'
    )
