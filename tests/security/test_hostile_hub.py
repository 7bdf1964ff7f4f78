"""The Hub is input: what a hostile one (tests/hubserver.FakeHub on loopback, told to lie) sends never names a path
outside umemc's cache and models dir, never makes a write go past the size it announced or through a link, and
never keeps `check` or `pull` waiting forever; each refusal says which bound was hit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hubserver import FakeHub
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

REPO, FILE = "acme/Tiny-GGUF", "tiny-Q8_0.gguf"


@pytest.fixture
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("hosted") / "tiny.gguf", TinySpec(n_layer=2, ftype="Q8_0"))


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield h


def stack(tmp_path: Path, spelling: str = f"{REPO}/{FILE}") -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(
        'version = 1\nname = "hub"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.chat]\n'
        f'runtime = "llama-server"\nhf = "{spelling}"\ncontext = 2048\n'
    )
    return path


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def said(err: str) -> str:
    """What the check said the Hub did (the part after the stack's own words)."""
    return err.split("and the Hub could not size it: ", 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize("commit", ["../../../escaped", "/tmp/elsewhere", "c0ffee" * 6 + "c0fF", "x" * 40])
def test_a_commit_that_is_no_commit_id_names_no_path(hub: FakeHub, tiny: Path, tmp_path: Path, run_cli, commit) -> None:
    hub.add(REPO, FILE, tiny, commit=commit)
    path = stack(tmp_path)
    before = files_under(tmp_path.parent)
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert said(err) == (
        f"the Hub named {commit!r} as the commit of {REPO} at main: not a commit id (40 hex digits); nothing was "
        "written"
    )
    assert files_under(tmp_path.parent) - before == set()  # the cache and every place around it untouched
    assert not (tmp_path / "stack.calibration.json").exists()


@pytest.mark.parametrize("size", [2**62, -5, 0])
def test_a_size_that_is_no_files_size_is_refused(hub: FakeHub, tiny: Path, tmp_path: Path, run_cli, size) -> None:
    hub.add(REPO, FILE, tiny).announced = size
    code, out, err = run_cli("check", str(stack(tmp_path)))
    assert (code, out) == (2, "")
    assert said(err) == f"the Hub gave {REPO}/{FILE} a size of {size}: not a file's size (1 byte to 4 TiB)"
    code, out, err = run_cli("pull", str(stack(tmp_path)), "--quiet")  # pull sizes the stack first: the same
    assert (code, said(err)) == (2, f"the Hub gave {REPO}/{FILE} a size of {size}: not a file's size (1 byte to 4 TiB)")


def test_a_split_name_the_header_does_not_bear_out_asks_for_no_other_part(
    hub: FakeHub, tiny: Path, tmp_path: Path, run_cli
) -> None:
    """A file named as the first of 900 parts whose header says it is no split: one HEAD and one header read,
    then a refusal, not 899 more HEADs."""
    name = "tiny-00001-of-00900.gguf"
    hub.add(REPO, name, tiny)
    code, _, err = run_cli("check", str(stack(tmp_path, f"{REPO}/{name}")))
    assert code == 2
    assert said(err) == f"{name}: its name says 900 parts, its header says None"
    heads = [r for r in hub.requests if r.method == "HEAD"]
    assert len(heads) == 1


def test_a_split_of_more_parts_than_llama_cpp_reads_is_refused_at_its_key(tmp_path: Path, run_cli) -> None:
    code, out, err = run_cli("check", str(stack(tmp_path, f"{REPO}/m-00001-of-99999.gguf")))
    assert (code, out) == (2, "")
    assert err == (
        f"{tmp_path / 'stack.toml'}:8:6: models.chat.hf: a split GGUF of 99999 parts\n"
        "  hint: llama.cpp reads 1 to 65535 (split.count is 16-bit)\n"
    )


def test_a_hub_that_sends_more_than_it_announced_is_not_written_past_it(
    hub: FakeHub, tiny: Path, tmp_path: Path, run_cli
) -> None:
    """It announces 1000 bytes less than it sends: the download stops at what it announced (the sha256 it reports
    is that of the file's first announced bytes, computed here), which is not the Hub's, and the part is removed."""
    import hashlib

    announced = tiny.stat().st_size - 1000
    hosted = hub.add(REPO, FILE, tiny)
    hosted.announced = announced
    code, out, err = run_cli("pull", str(stack(tmp_path)), "--quiet")
    written = hashlib.sha256(tiny.read_bytes()[:announced]).hexdigest()
    assert (code, out, err) == (
        1,
        "",
        f"umemc pull: {FILE}: sha256 {written} is not the Hub's {hosted.sha256}; the file was removed "
        "(`umemc pull` downloads it again)\n",
    )
    assert not list((tmp_path / "models" / REPO).iterdir())


def test_a_part_file_planted_as_a_link_is_never_written_through(
    hub: FakeHub, tiny: Path, tmp_path: Path, run_cli
) -> None:
    hub.add(REPO, FILE, tiny)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    folder = tmp_path / "models" / REPO
    folder.mkdir(parents=True)
    (folder / (FILE + ".part")).symlink_to(outside)
    code, _, err = run_cli("pull", str(stack(tmp_path)), "--quiet")
    assert code == 1
    assert err.strip().endswith(
        f"{folder / (FILE + '.part')} is not a plain file (a link?): umemc writes no download through it; remove it"
    )
    assert outside.read_text() == "keep me\n"


def test_a_hub_that_trickles_is_given_up_saying_which_bound(
    hub: FakeHub, tiny: Path, tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One byte every 50 ms: each read arrives in time, the whole never would. The header's read is bounded (here
    at 1 s instead of 120 s), and so is a download's rate (at least 32 KiB/s once it has run 1 s instead of 60)."""
    from umemc.hub import download, remote

    monkeypatch.setattr(remote, "HEADER_DEADLINE_S", 1.0)
    monkeypatch.setattr(remote, "SLOW_NOTE_S", 0.3)
    monkeypatch.setattr(download, "RATE_AFTER_S", 1.0)
    hub.add(REPO, FILE, tiny)
    hub.trickle = 0.05
    code, _, err = run_cli("check", str(stack(tmp_path)))
    assert code == 2
    assert said(err).endswith(" bytes in 1 s: too slow, gave up (a header's whole read is bounded)")
    # while it waited it said so, once: what it reads, from where, how far it got and when it gives up
    notes = [x for x in err.splitlines() if x.startswith("umemc: reading ")]
    assert len(notes) == 1 and notes[0].startswith(f"umemc: reading {FILE}'s header from 127.0.0.1:")
    assert notes[0].endswith(" bytes in 0.3 s; giving up at 1 s")
    fallback = stack(tmp_path)  # sized by a preset while the Hub cannot say: the download itself trickles
    fallback.write_text(fallback.read_text() + 'arch = "llama-3-8b"\n')
    code, _, err = run_cli("pull", str(fallback), "--quiet")
    assert code == 1 and err.endswith(" KiB/s: too slow, gave up; `umemc pull` again continues from there\n"), err


def test_a_disk_that_fills_under_a_download_fails_it_saying_so() -> None:
    """A write refused for room (ENOSPC: /dev/full refuses every write with it) ends the download with what to do,
    never as a dropped connection asked again, never as success."""
    import hashlib

    from umemc.hub.download import _Download
    from umemc.hub.ref import HubFailure

    class Bar:
        total = 10

        def update(self, n: int) -> None:
            pass

    with open("/dev/full", "r+b", buffering=0) as f:
        d = _Download(f, hashlib.sha256(), Bar(), 0, 10)
        with pytest.raises(HubFailure) as got:
            d.write(b"0123456789")
    assert str(got.value) == (
        "cannot write the download to /dev/full (No space left on device) at 0 of 10 bytes: free room there, then "
        "`umemc pull` again continues from what was written"
    )
