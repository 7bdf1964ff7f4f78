"""`umemc init`: a commented stack that `umemc check` accepts, for a named preset or the detected machine.
Detection reads fixture trees in the kernel's own formats: /proc/meminfo ("MemTotal:  N kB"), amdgpu's
sysfs files (one integer and a newline: vendor "0x1002", mem_info_vram_total / mem_info_gtt_total in
bytes), the device tree's model string (NUL-terminated) and /etc/nv_tegra_release."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.realmodels import MODELS, needs_models
from umemc.commands.init import Machine, detect, preset_for
from umemc.stack.presets import PLATFORM_PRESETS
from umemc.units import GiB


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def meminfo(kb: int) -> str:
    return f"MemTotal:       {kb} kB\nMemFree:        1000 kB\nMemAvailable:   2000 kB\n"


def test_detects_an_amd_apu_and_picks_its_preset(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "proc/meminfo": meminfo(131_072_000),  # a 128 GiB box: MemTotal is a little under 128 x 2^20 kB
            "sys/class/drm/card1/device/vendor": "0x1002\n",
            "sys/class/drm/card1/device/mem_info_vram_total": "536870912\n",
            "sys/class/drm/card1/device/mem_info_gtt_total": "128849018880\n",
        },
    )
    m = detect(root, "linux")
    assert m == Machine("amd-apu", 131_072_000 * 1024, "AMD APU (card1, 0.5 GiB carve-out)")
    assert preset_for(m) == "strix-halo-128"


def test_detects_jetson_and_a_plain_cpu(tmp_path: Path) -> None:
    jetson = tree(
        tmp_path / "j",
        {
            "proc/meminfo": meminfo(64_000_000),
            "etc/nv_tegra_release": "# R36 (release), REVISION: 4.0\n",
            "proc/device-tree/model": "NVIDIA Jetson AGX Orin Developer Kit\0",
        },
    )
    m = detect(jetson, "linux")
    assert (m.kind, m.why, preset_for(m)) == (
        "nvidia-unified",
        "Jetson (NVIDIA Jetson AGX Orin Developer Kit)",
        "jetson-orin-64",
    )
    plain = tree(tmp_path / "c", {"proc/meminfo": meminfo(24_000_000)})
    assert detect(plain, "linux") == Machine("cpu", 24_000_000 * 1024, "no unified-memory GPU found")
    assert preset_for(detect(plain, "linux")) is None


@pytest.mark.parametrize("preset", sorted(PLATFORM_PRESETS))
def test_every_preset_gives_a_stack_check_accepts(tmp_path: Path, run_cli, preset: str) -> None:
    code, out, _ = run_cli("init", "--platform", preset, "-o", "s.toml", cwd=tmp_path)
    assert (code, out) == (0, f"wrote s.toml for platform preset {preset}; next: umemc check s.toml\n")
    text = (tmp_path / "s.toml").read_text()
    assert f'preset = "{preset}"' in text and 'name = "s"' in text
    code, _, err = run_cli("check", "s.toml", "--format", "json", cwd=tmp_path)
    assert code in (0, 1)  # valid (whether an 8B model fits a 36 GiB Mac is the budget's business)
    assert err == ('warning: s.toml:19:9: models.chat.model: file not found, estimating from arch = "llama-3-8b"\n')


def test_detected_machine_without_a_preset_and_no_overwrite(tmp_path: Path, run_cli) -> None:
    code, out, _ = run_cli("init", cwd=tmp_path)  # this machine (no preset for it: kind + memory)
    assert code == 0 and out.startswith("wrote stack.toml for this machine: ")
    assert run_cli("check", "stack.toml", cwd=tmp_path)[0] in (0, 1)
    assert run_cli("init", cwd=tmp_path) == (
        2,
        "",
        "stack.toml exists: choose another -o, or --force to replace it\n",
    )
    assert run_cli("init", "--force", "--name", "Bad Name", cwd=tmp_path) == (
        2,
        "",
        "stack name 'Bad Name' must match ^[a-z][a-z0-9_-]{0,62}$: give --name\n",
    )


def test_memory_rounds_to_the_installed_ram() -> None:
    # MemTotal of a 64 GiB Mac-less box is below 64 GiB: the preset of that size is still found
    assert preset_for(Machine("amd-apu", 62 * GiB, "x")) == "strix-halo-64"
    assert preset_for(Machine("amd-apu", 50 * GiB, "x")) is None


def test_init_comments_show_the_real_os_reserve_default() -> None:
    from umemc.commands.init import platform_table

    # a 24 GB box: MemTotal 24_000_000 kB = 23437.5 MiB is what the OS sees, written as such (never rounded up to
    # the installed RAM); the default reserve is memory / 8 = 2929 MiB = 2.86 GiB
    table = platform_table(None, Machine("cpu", 24_000_000 * 1024, "no unified-memory GPU found"))
    assert 'memory = "23437MiB"        # /proc/meminfo MemTotal 24576000000 bytes: what the OS sees' in table
    assert '# os_reserve = "2929MiB"  # the default (min(8 GiB, memory / 8))' in table
    # 128 GiB: the 8 GiB cap
    table = platform_table(None, Machine("cpu", 128 * 2**30, "no unified-memory GPU found"))
    assert '# os_reserve = "8192MiB"  # the default (min(8 GiB, memory / 8))' in table


def test_a_bios_carve_out_is_counted_as_what_it_is(tmp_path: Path, run_cli) -> None:
    """A Strix Halo 128 GB whose BIOS reserves 96 GiB for the GPU (UMA frame buffer): the OS sees ~31 GiB.
    init writes kind = amd-apu with the installed RAM and the carve-out, and check says which BIOS setting."""
    root = tree(
        tmp_path / "root",
        {
            "proc/meminfo": meminfo(32_505_856),  # 31 GiB: the 32 GiB the carve-out leaves, less the kernel's
            "sys/class/drm/card1/device/vendor": "0x1002\n",
            "sys/class/drm/card1/device/device": "0x1586\n",  # Strix Halo's Radeon 8060S
            "sys/class/drm/card1/device/mem_info_vram_total": f"{96 * GiB}\n",
            "sys/class/drm/card1/device/mem_info_gtt_total": f"{16 * GiB}\n",
        },
    )
    m = detect(root, "linux")
    assert m == Machine(
        "amd-apu", 32_505_856 * 1024 + 96 * GiB, "AMD APU (card1) with a 96.0 GiB BIOS carve-out", 96 * GiB
    )
    assert preset_for(m) is None
    from umemc.commands.init import TEMPLATE, platform_table

    out = tmp_path / "stack.toml"
    out.write_text(TEMPLATE.format(file=out.name, name="carved", platform=platform_table(None, m)))
    text = out.read_text()
    # what the OS sees (31 GiB) and the carve-out (96 GiB) beside it: 127 GiB = 130048 MiB, never rounded up
    assert 'kind = "amd-apu"' in text and 'memory = "130048MiB"' in text and 'uma_carveout = "96GiB"' in text
    assert 'gpu_window = "15872MiB"' in text  # the driver's default GTT: half of the 31 GiB the carve-out leaves
    line = [x.startswith("uma_carveout") for x in text.splitlines()].index(True) + 1
    code, out_json, err = run_cli("check", str(out), "--format", "json")
    assert code == 0
    assert [x for x in err.splitlines() if "uma_carveout" in x] == [
        f"warning: {out}:{line}:16: platform.uma_carveout: the BIOS reserves 96.0 GiB of the 127.0 GiB for the GPU "
        "(its UMA frame buffer): the OS sees 31.0 GiB, and the models' CPU side has 23.0 GiB of it. With the "
        "smallest frame buffer (BIOS setup: UMA Frame Buffer Size, or iGPU Memory Size, = 512M) the GPU maps system "
        "memory through its GTT instead (ttm.pages_limit, which `umemc apply` sets) and every GiB serves either side"
    ]
    cap = __import__("json").loads(out_json)["capacity"]
    assert cap["gpu_window_bytes"] == 96 * GiB + 31 * GiB // 2  # the VRAM and the GTT window


def test_init_scaffolds_the_models_it_finds(tmp_path: Path, run_cli, monkeypatch) -> None:
    """A directory of GGUF files (a split one counted once) and a Hub file: one model each, sized from its
    header (the sizes in the comments are the tensor bytes the gguf package wrote), the largest LLM hot."""
    from tests.hubserver import FakeHub
    from umemc.estimate.gguf_header import read_header
    from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

    models = tmp_path / "models"
    (models / "split").mkdir(parents=True)
    big = write_tiny_gguf(models / "Big-Chat-Q8_0.gguf", TinySpec(n_layer=4, n_embd=256, n_ff=512, ftype="Q8_0"))
    small = write_tiny_gguf(models / "small.gguf", TinySpec(n_layer=2))
    write_tiny_gguf(models / "split" / "Parted.gguf", TinySpec(n_layer=4), split_max_tensors=12)
    (models / "notes.gguf").write_text("not a model\n")
    hosted = write_tiny_gguf(tmp_path / "hosted.gguf", TinySpec(n_layer=3))

    def weights(p: Path) -> int:
        return sum(t.n_bytes for t in read_header(p).tensors)

    with FakeHub() as hub:
        hub.add("acme/Remote-GGUF", "remote-F16.gguf", hosted)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
        code, out, err = run_cli(
            "init", "--platform", "strix-halo-128", "--hf", "acme/Remote-GGUF/remote-F16.gguf", cwd=tmp_path
        )
    assert code == 0, err
    assert out == (
        "wrote stack.toml for platform preset strix-halo-128, 4 model(s) found: big-chat-q8_0, small, parted, "
        "remote-f16; next: umemc check stack.toml\n"
    )
    text = (tmp_path / "stack.toml").read_text()
    from umemc.units import human

    parted = sum(weights(p) for p in sorted((models / "split").glob("Parted-*.gguf")))
    assert f'model = "models/Big-Chat-Q8_0.gguf"  # {human(weights(big))} of weights: llama, Q8_0, 4 layers' in text
    assert f'model = "models/small.gguf"  # {human(weights(small))} of weights: llama, F16, 2 layers' in text
    assert f'model = "models/split/Parted-00001-of-00004.gguf"  # {human(parted)} of weights: llama, F16' in text
    assert f'hf = "acme/Remote-GGUF/remote-F16.gguf"  # {human(weights(hosted))} of weights: llama, F16' in text
    assert text.count('mode = "hot"') == 1 and '[models.big-chat-q8_0]\nruntime = "llama-server"' in text
    # the cold ones go away when idle, as a model Ollama loaded for a request does
    assert text.count('mode = "cold"') == text.count('ttl = "5m"') == 3
    # the Hub is gone: init recorded the header in the lock, so check sizes the remote model without it
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0, err
    doc = __import__("json").loads(out)["models"]
    assert doc["remote-f16"]["source"] == "lock" and doc["remote-f16"]["weights_bytes"] == weights(hosted)


@needs_models
def test_init_sets_the_chat_template_a_file_lacks_where_its_architecture_says_it(tmp_path: Path, run_cli) -> None:
    """Gemma 3 270M's GGUF has no chat template: init names Gemma's built-in one, and check then warns of nothing;
    SmolLM2's file has its own (ChatML), so its model gets none. The hot chat model is the one that carries a chat
    template (SmolLM2-Instruct), though Gemma 3 is the larger: a file without one is likely a base model, said so."""
    models = tmp_path / "models"  # the two GGUF files alone (.venv/models may hold a Hugging Face directory too)
    models.mkdir()
    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"):
        (models / name).symlink_to(MODELS / name)
    code, out, err = run_cli("init", "--platform", "strix-halo-128", "--models", str(models), cwd=tmp_path)
    assert code == 0, err
    assert out.strip().endswith(
        "; gemma3 carries no chat template (likely a base model: it continues text, ask it with /v1/completions); "
        "next: umemc check stack.toml"
    )
    text = (tmp_path / "stack.toml").read_text()
    tables = {t.split("]", 1)[0]: t for t in text.split("\n[models.")[1:]}
    assert 'mode = "hot"' in tables["smollm2"] and 'mode = "cold"' in tables["gemma3"]
    said = '\nchat_template = "gemma"  # the file has none; llama.cpp\'s built-in for it\n'
    # named by their families as their headers say them (general.basename "gemma-3", "smollm2"), not file stems
    assert sorted(tables) == ["gemma3", "smollm2"]
    assert said in tables["gemma3"]
    assert "chat_template" not in tables["smollm2"]
    code, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert (code, err) == (0, "")


@needs_models
def test_two_files_of_one_family_are_told_apart_by_size(tmp_path: Path, run_cli) -> None:
    """Two Gemma 3 files (links to the same one): the size label the header carries, then a number."""
    import os

    models = tmp_path / "models"
    models.mkdir()
    gemma = next(MODELS.glob("gemma-3-*.gguf"))
    for name in ("a.gguf", "b.gguf"):
        os.link(gemma, models / name)
    code, _, err = run_cli("init", "--platform", "strix-halo-128", "--models", str(models), cwd=tmp_path)
    assert code == 0, err
    text = (tmp_path / "stack.toml").read_text()
    assert sorted(t.split("]", 1)[0] for t in text.split("\n[models.")[1:]) == ["gemma3-270m", "gemma3-270m-2"]
