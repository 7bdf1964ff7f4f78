"""The calibration file (`STACK.calibration.json`) is input: it may sit in a shared repository. A forged figure never
makes `check` say FITS where the model's own file says otherwise, a figure outside sense is refused at its field,
and a file that is no file (a FIFO, a link to a device), too large or nested past reason is refused at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

SPEC = TinySpec(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=1000)


def stack(tmp_path: Path, memory: str = "16GiB") -> Path:
    write_tiny_gguf(tmp_path / "tiny.gguf", SPEC)
    path = tmp_path / "stack.toml"
    path.write_text(
        f'version = 1\nname = "cal"\n[platform]\nkind = "cpu"\nmemory = "{memory}"\nos_reserve = "64MiB"\n'
        '[models.chat]\nruntime = "llama-server"\nmodel = "tiny.gguf"\ncontext = 1024\n'
    )
    return path


def forged_measurement(path: Path, weights: int, rss: int, kv: int = 0, compute: int = 0) -> None:
    """A `measured` entry as a forger would write it: the real file's identity (its size and the sha256 of its
    first 4 MiB, anyone can compute them) and the flags the model runs with now, so it would be used; forged
    figures."""
    import hashlib

    from umemc.estimate import keys
    from umemc.stack.resolve import load_stack

    loaded = load_stack(path)
    flags = keys.llama(loaded, loaded.models["chat"])
    data = (path.parent / "tiny.gguf").read_bytes()
    ident = {"size": len(data), "sha256_head": hashlib.sha256(data[: 4 * 2**20]).hexdigest()}
    buffers = {"CPU": {"model": weights, "kv": kv, "compute": compute}}
    entry = {"file": ident, "flags": flags, "measured": {"buffers": buffers, "rss_bytes": rss}}
    doc = {"format": "umemc-calibration", "version": 1, "models": {"chat": entry}}
    path.with_name("stack.calibration.json").write_text(json.dumps(doc))


def header_tensor_bytes(gguf_path: Path) -> int:
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(gguf_path).tensors)


def test_a_forged_measurement_below_the_files_own_tensors_never_makes_it_fit(tmp_path: Path, run_cli) -> None:
    """100 MiB less 64 reserved: the honest estimate (llama-server's process alone is 24 MiB and 96 bytes for each of
    the 1000 tokens) does not fit; a record saying 3 bytes of weights and 3 of resident memory would. It is
    refused, said, and the verdict stands."""
    path = stack(tmp_path, "100MiB")
    code, out, _ = run_cli("check", str(path), "--format", "json")
    assert code == 1 and json.loads(out)["fits"] is False
    forged_measurement(path, 3, 3)
    code, out, err = run_cli("check", str(path), "--format", "json")
    doc = json.loads(out)
    assert (code, doc["fits"], doc["models"]["chat"]["source"]) == (1, False, "gguf")
    assert doc["models"]["chat"]["weights_bytes"] == header_tensor_bytes(tmp_path / "tiny.gguf")
    assert err.startswith(
        f"warning: {path}:7:1: models.chat: stack.calibration.json: the measured weights of 3 bytes are below the "
        f"{header_tensor_bytes(tmp_path / 'tiny.gguf')} bytes of tensors the GGUF header holds: not used (a stale "
        "or forged record); `umemc check --measure` asks llama.cpp again\n"
    )


@pytest.mark.parametrize(
    ("figure", "field"),
    [(-5, "models.chat.measured.rss_bytes"), (2**62, "models.chat.measured.rss_bytes")],
)
def test_a_figure_outside_sense_is_refused_at_its_field(tmp_path: Path, run_cli, figure: int, field: str) -> None:
    path = stack(tmp_path)
    forged_measurement(path, 10**6, figure)
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    bound = ">= 0" if figure < 0 else "<= 1152921504606846976"
    assert err == f"{tmp_path / 'stack.calibration.json'}: umemc-calibration field {field}: Expected `int` {bound}\n"


def test_a_file_nested_past_reason_is_refused(tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path)
    path.with_name("stack.calibration.json").write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = run_cli("check", str(path))
    assert (code, out, err) == (
        2,
        "",
        f"{tmp_path / 'stack.calibration.json'}: nests too deep to be a umemc-calibration file\n",
    )


def test_a_file_larger_than_any_umemc_writes_is_not_read_whole(tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path)
    with path.with_name("stack.calibration.json").open("wb") as f:
        f.truncate(64 * 2**20)  # sparse: 64 MiB of zeros
    code, out, err = run_cli("check", str(path))
    assert (code, out, err) == (
        2,
        "",
        f"{tmp_path / 'stack.calibration.json'}: larger than 16 MiB: not a calibration file umemc wrote\n",
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_special_file_in_its_place_is_refused_without_waiting(tmp_path: Path, kind: str) -> None:
    """As its own process, bounded in time: a FIFO without a writer would block a reader forever, /dev/zero
    would be read until memory ran out, a directory was an internal error."""
    path = stack(tmp_path)
    cal = path.with_name("stack.calibration.json")
    if kind == "fifo":
        os.mkfifo(cal)
    elif kind == "directory":
        cal.mkdir()
    else:
        cal.symlink_to("/dev/zero")
    for command in ("check", "build"):
        out = ["-o", str(tmp_path / "out")] if command == "build" else []
        done = subprocess.run(
            [sys.executable, "-m", "umemc", command, str(path), *out], capture_output=True, text=True, timeout=60
        )
        what = {"fifo": "a FIFO", "dev-zero": "a character device", "directory": "a directory"}[kind]
        assert (done.returncode, done.stdout, done.stderr) == (
            2,
            "",
            f"{cal}: {what}, not a file: a calibration file is plain JSON umemc wrote\n",
        )
    assert not (tmp_path / "out").exists()


def locked_without_file(path: Path, **forged: object) -> dict:
    """The header and file identity the lock records of tiny.gguf (read by umemc's reader, as `calibrate` records
    them), `forged` fields put over them, and the file itself removed: a checkout of the shared repository that
    has the calibration file and not the model."""
    from umemc.document import values
    from umemc.estimate.gguf_file import locked_header
    from umemc.estimate.gguf_file import read as read_gguf
    from umemc.lockfile import identity

    gguf_path = path.parent / "tiny.gguf"
    header = values(locked_header(read_gguf(gguf_path)))
    ident = values(identity(gguf_path))
    for key, value in forged.items():
        where = ident if key == "size" else header
        where[key] = value
    doc = {"format": "umemc-calibration", "version": 1, "models": {"chat": {"file": ident, "header": header}}}
    path.with_name("stack.calibration.json").write_text(json.dumps(doc))
    gguf_path.unlink()
    return header


def test_a_recorded_header_sizes_a_model_whose_file_is_absent_and_says_it_is_unconfirmed(
    tmp_path: Path, run_cli
) -> None:
    path = stack(tmp_path)
    tensors = header_tensor_bytes(tmp_path / "tiny.gguf")  # the gguf package's own reader
    locked_without_file(path)
    code, out, err = run_cli("check", str(path), "--format", "json")
    doc = json.loads(out)
    assert (code, doc["fits"], doc["models"]["chat"]["source"]) == (0, True, "lock")
    assert doc["models"]["chat"]["weights_bytes"] == tensors
    assert err == (
        f"warning: {path}:9:9: models.chat.model: file not found, estimating from the header stack.calibration.json "
        "recorded (not confirmed against the file)\n"
    )


# tiny.gguf's shape: a vocabulary of 1000 x 256, and per layer (2) a 256 x 256 projection and a feed-forward
# of 2 x 256 x 512: 911,360 weights at 1.5 bits at least = 170,880 bytes
@pytest.mark.parametrize(
    ("forged", "why"),
    [
        (
            {"tensor_bytes": 3},
            "3 bytes of tensors where its own shape (2 layers of 256, a vocabulary of 1000) needs at least 170880",
        ),
        ({"size": 2**40}, "{tensors} bytes of tensors in a file of 1099511627776 bytes: the rest is larger than any "
         "GGUF header"),
        ({"size": 1000}, "{tensors} bytes of tensors in a file of 1000 bytes"),
    ],
)  # fmt: skip
def test_a_recorded_header_that_cannot_be_the_files_is_not_used(
    tmp_path: Path, run_cli, forged: dict, why: str
) -> None:
    path = stack(tmp_path)
    tensors = header_tensor_bytes(tmp_path / "tiny.gguf")
    locked_without_file(path, **forged)
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines()[-2:] == [
        f"{path}:9:9: models.chat.model: file not found: {tmp_path / 'tiny.gguf'}; stack.calibration.json: "
        f"the header recorded for tiny.gguf is not used: {why.format(tensors=tensors)} (a stale or forged record)",
        '  hint: put the file here and run `umemc calibrate`, or give arch = "<preset>" or memory = "…"',
    ]
    # with a preset to fall back on, the model is sized by it, and the record's refusal is said
    text = path.read_text().replace('model = "tiny.gguf"\n', 'model = "tiny.gguf"\narch = "llama-3-8b"\n')
    path.write_text(text)
    code, out, err = run_cli("check", str(path), "--format", "json")
    assert json.loads(out)["models"]["chat"]["source"] == "arch"
    assert err.splitlines()[-1] == (
        f"warning: {path}:7:1: models.chat: stack.calibration.json: the header recorded for tiny.gguf is not used: "
        f"{why.format(tensors=tensors)} (a stale or forged record); with the file here, `umemc calibrate` records it "
        "again"
    )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"n_layer": 10**9}, "its shape has 1000000000 layers (a header gives 1 to 4096)"),
        ({"n_head_kv": [2] * 3}, "its shape's n_head_kv has 3 entries for 2 layers"),
        ({"n_embd": "256"}, "its shape's n_embd is '256'"),
        ({"expert_weights_scale": -2.5}, "its shape's expert_weights_scale is -2.5"),
        ({"expert_weights_scale": float("inf")}, "its shape's expert_weights_scale is inf"),
        ({"bogus": 1}, "its shape has keys no header gives: bogus"),
        ({"block_norms": "sideways"}, "its shape's block_norms is 'sideways'"),
        ({"unroped_layers": [True] * 5}, "its shape's unroped_layers has 5 entries for 2 layers"),
    ],
)
def test_a_recorded_shape_no_header_could_give_is_not_used(tmp_path: Path, run_cli, change: dict, why: str) -> None:
    # a record whose shape claims a billion layers would have every per-layer table built that large; one with a
    # key or a value no header gives crashed the estimate: each is refused as the record, not sized
    from umemc.estimate.gguf_file import read as read_gguf

    path = stack(tmp_path)
    shape = read_gguf(tmp_path / "tiny.gguf").shape
    assert shape is not None
    locked_without_file(path, shape={**shape._asdict(), **change})
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines()[-2] == (
        f"{path}:9:9: models.chat.model: file not found: {tmp_path / 'tiny.gguf'}; stack.calibration.json: "
        f"the header recorded for tiny.gguf is not used: {why} (a stale or forged record)"
    )


def test_a_forged_kv_cache_below_what_the_header_needs_never_makes_it_fit(tmp_path: Path, run_cli) -> None:
    """The weights as the header holds them, but no KV cache: refused, said, and the estimate stands. tiny.gguf's
    cache at context 1024: K and V of 2 layers x 1024 positions x 2 KV heads x 64 dims, f16: 1,048,576 bytes."""
    path = stack(tmp_path)
    forged_measurement(path, header_tensor_bytes(tmp_path / "tiny.gguf"), 10**9, kv=0, compute=10**9)
    code, out, err = run_cli("check", str(path), "--format", "json")
    doc = json.loads(out)
    assert (code, doc["models"]["chat"]["source"], doc["models"]["chat"]["kv_bytes"]) == (0, "gguf", 1048576)
    assert err == (
        f"warning: {path}:7:1: models.chat: stack.calibration.json: the measured KV cache of 0 bytes is below 90% of "
        "the 1048576 bytes its header's shape needs: not used (a stale or forged record); `umemc check --measure` "
        "asks llama.cpp again\n"
    )


@pytest.mark.parametrize(("kv", "used"), [(943718, False), (943719, True)])
def test_a_recorded_kv_cache_is_held_to_ninety_percent_of_the_headers(
    tmp_path: Path, run_cli, kv: int, used: bool
) -> None:
    """90% of tiny.gguf's 1,048,576 bytes of KV is 943,718.4: one byte below the bound is refused, at it used."""
    path = stack(tmp_path)
    forged_measurement(path, header_tensor_bytes(tmp_path / "tiny.gguf"), 10**9, kv=kv, compute=10**9)
    code, out, _ = run_cli("check", str(path), "--format", "json")
    doc = json.loads(out)["models"]["chat"]
    expected = (0, "measured", kv) if used else (0, "gguf", 1048576)
    assert (code, doc["source"], doc["kv_bytes"]) == expected
