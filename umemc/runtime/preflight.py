"""Before `umemc up` starts anything: compare the live machine with the plan. Each failed check
says what is wrong and the exact command that fixes it. The VM tunables (sysctl) refuse a start only where the
stack's hot set holds half the machine's memory or more (below that they warn, with the fix), and a rehearsal
(--simulate) judges them as the real run does; the settings of hardware a rehearsal's placeholders do not use
(GPU window, ROCm, memlock) only warn under --simulate. `up --skip CHECK` starts despite a named check."""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import ModelDoc, PlanDoc
from ..units import gib
from .findings import Finding, umemc_command
from .probes import hostroot, machine
from .probes.darwin import CommandSysctl, Sysctl, default_wired_limit
from .probes.host import Box, probes
from .rundir import GATEWAY, RunDir


@dataclass
class Preflight:
    bundle: Path
    plan: PlanDoc
    simulate: bool = False
    # where the machine is read: this one, or the recorded one UMEMC_HOST_ROOT names (fixture trees in tests)
    proc_sys: str = field(default_factory=lambda: str(hostroot.path("/proc/sys")))
    host_os: str = field(default_factory=hostroot.host_os)
    root: Path = field(default_factory=hostroot.root)
    box: Box | None = None  # the machine's memory and swap (default: this host's probes)
    sysctl: Sysctl | None = None  # macOS's variables (default: the `sysctl` command)
    swap_volume: Callable[[], str] = machine.swap_volume  # where macOS keeps its swap files
    swap_room: Callable[[str], int | None] = machine.swap_room  # its free bytes (None: a recorded Mac's, unknown)
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.box is None:
            p = self.plan
            self.box = probes(p.platform.kind, p.platform.gpu_window_bytes, p.policy.evict_above).box

    def run(self, running: Collection[str] = frozenset()) -> list[Finding]:
        self.findings = []
        self._budget()
        self._machine(between=lambda: self._memory(running))
        if not self.simulate:
            self._files_and_executables()
            self._helpers(running)
        self._ports(running)
        self._slots_disk()
        self._gateway_token()
        return self.findings

    def machine(self) -> list[Finding]:
        """The checks of the machine itself, for `umemc doctor`: its OS, VM tunables, memlock, GPU window, ROCm,
        swap and cgroups against the plan; nothing of the stack's files, ports or running workers."""
        self.findings = []
        self._machine()
        return self.findings

    def _machine(self, between: Callable[[], None] = lambda: None) -> None:
        """The machine's checks, `between` run after the host's settings (the memory the stack would start beside)."""
        if self._host():
            self._sysctl()
            self._memlock()
        between()
        if self._host_matches():
            self._gpu_window()
            if self.plan.platform.kind == "amd-apu":
                self._rocm()
            self._swap()
            self._cgroups()

    def blocking(self, skip: Collection[str] = ()) -> list[Finding]:
        """The problems that refuse the start: neither advisory nor skipped by name (`up --skip CHECK`; "all").
        A rehearsal (--simulate) judges the host as the real run does, but for the hardware its placeholders do
        not use (the GPU window, ROCm, memlock: `host` findings)."""
        return [
            f
            for f in self.findings
            if not f.ok
            and not f.advisory
            and not (self.simulate and f.host)
            and f.check not in skip
            and "all" not in skip
        ]

    def _passed(self, check: str, message: str, **kw: Any) -> None:
        self.findings.append(Finding.passed(check, message, **kw))

    def _failed(self, check: str, message: str, fix: tuple[str, ...] = (), **kw: Any) -> None:
        self.findings.append(Finding.failed(check, message, fix, **kw))

    def _host_matches(self) -> bool:
        return (self.plan.platform.kind == "apple") == (self.host_os == "darwin")

    # -- checks ---------------------------------------------------------------------------------
    def _host(self) -> bool:
        """The bundle's host settings only make sense on the operating system it was built for."""
        kind, here = self.plan.platform.kind, {"darwin": "macOS", "linux": "Linux"}.get(self.host_os, self.host_os)
        if self._host_matches():
            self._passed("host", f'kind = "{kind}" runs on {here}', host=True)
            return True
        want = "macOS" if kind == "apple" else "Linux"
        self._failed(
            "host",
            f'this stack is for {want} (platform kind = "{kind}"), this host runs {here}: '
            "its host settings and GPU window do not apply here",
            ("umemc check STACK  # with [platform] describing this machine",),
            host=True,
        )
        return False

    def _budget(self) -> None:
        cap = self.plan.capacity
        if cap.fits:
            self._passed(
                "budget",
                f"the hot set's hard quotas ({gib(cap.hot_total_bytes)} GiB) fit the "
                f"budget ({gib(cap.budget_bytes)} GiB)",
            )
            return
        over = cap.hot_total_bytes - cap.budget_bytes
        gpu = cap.gpu_budget_bytes
        if gpu is not None and cap.hot_gpu_total_bytes - gpu > over:
            over = cap.hot_gpu_total_bytes - gpu
        self._failed(
            "budget",
            f"the hot set does not fit its budget (over by {gib(over)} GiB)",
            ("umemc check STACK  # says what would make it fit",),
        )

    def _sysctl(self) -> None:
        conf = self.bundle / "sysctl/90-umemc.conf"
        if not conf.exists():
            return  # macOS bundles have no Linux VM tunables
        wanted = parse_sysctl_conf(conf.read_text())
        bad = []
        for key, value in wanted.items():
            live = read_sysctl(key, self.proc_sys)
            if live is None:
                continue  # not on this kernel
            need = sysctl_shortfall(key, live, value)
            if need is not None:
                bad.append((key, live, value, need))
        if not bad:
            self._passed("sysctl", f"{len(wanted)} VM tunables as planned (or safer)", host=True)
            return
        what = "; ".join(f"{k} is {live}, the plan needs {need}" for k, live, _, need in bad)
        now = shlex.join(["sudo", "sysctl", "-w", *(f"{k}={want}" for k, _, want, _ in bad)])
        cap = self.plan.capacity
        if cap.hot_total_bytes * 2 < cap.usable_bytes:  # the kernel has room: its tuning cannot sink this stack
            what += (
                f" (this stack's hot set, {gib(cap.hot_total_bytes)} of {gib(cap.usable_bytes)} GiB, leaves the "
                "kernel room: a warning; the settings matter once the hot set holds half the memory)"
            )
        pressing = cap.hot_total_bytes * 2 >= cap.usable_bytes
        self._failed("sysctl", what, (self._apply, f"or now, until the next boot: {now}"), advisory=not pressing)

    @property
    def _apply(self) -> str:
        """`sudo umemc apply BUNDLE`: the sysctl file (loaded at once), the GTT limit, the unit."""
        return umemc_command("apply", str(self.bundle.resolve()), sudo=True)

    def _memlock(self) -> None:
        locked = sum(m.quota_hard_bytes for m in self.plan.models.values() if m.mlock and m.mode == "hot")
        if not locked:
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if os.geteuid() == 0 or hard == resource.RLIM_INFINITY or hard >= locked:
            self._passed("memlock", "RLIMIT_MEMLOCK can be raised for supervisord", host=True)
            return
        self._failed(
            "memlock",
            f"models lock {gib(locked)} GiB but RLIMIT_MEMLOCK is {hard} bytes",
            (
                "sudo prlimit --memlock=unlimited:unlimited --pid $$   # in the shell, then umemc up again",
                f"or run the stack as its systemd unit (LimitMEMLOCK=infinity): {self._apply}",
            ),
            host=True,
        )

    def _memory(self, running: Collection[str]) -> None:
        assert self.box is not None
        need = sum(m.quota_hard_bytes for n, m in self.plan.models.items() if m.mode == "hot" and n not in running)
        if not need:  # no hot worker to start (they run already, or the stack has none): nothing to cover
            return
        available, name = self.box.available() or 0, self.box.available_name
        if available >= need:
            self._passed("memory", f"{name} {gib(available)} GiB covers the hot set's hard quotas ({gib(need)} GiB)")
        else:
            self._failed(
                "memory",
                f"{name} is {gib(available)} GiB but the hot set's hard quotas need {gib(need)} GiB",
                ("free memory (stop other programs), or make models cold in the stack",),
            )

    def _gpu_window(self) -> None:
        p = self.plan.platform
        if p.gpu_window_bytes is None:
            return
        if p.kind == "amd-apu":
            self._carveout()
            self._amd_window(p.gpu_window_bytes)
        elif p.kind == "apple":
            self._apple_window(p.gpu_window_bytes)

    def _carveout(self) -> None:
        """The BIOS's UMA frame buffer as the driver reports it (amdgpu's mem_info_vram_total, bytes), against
        what the plan counts: memory the OS never sees is memory the budget must not give out."""
        live = apu_carveout(self.root)
        planned = self.plan.platform.uma_carveout_bytes or 0
        if live is None or abs(live - planned) <= CARVEOUT_SLACK:
            return
        self._failed(
            "carve-out",
            f"the BIOS reserves {gib(live)} GiB of RAM for the GPU (UMA frame buffer, mem_info_vram_total) and the "
            f"plan counts {gib(planned)} GiB: the OS has {gib(live - planned)} GiB less than the budget assumes",
            (
                "BIOS setup: set UMA Frame Buffer Size (or iGPU Memory Size) to 512M, then reboot",
                f'or count it: [platform] uma_carveout = "{round(live / (1 << 30))}GiB" (`umemc init` writes it)',
            ),
            host=True,
            reboot=True,
        )

    def _amd_window(self, want: int) -> None:
        """The GTT amdgpu sized when it loaded (mem_info_gtt_total: the window in force) against the plan's window:
        at least as large passes (a 124 GiB GTT holds a 120 GiB plan). The ttm parameter is read only to say what
        the next boot brings: amdgpu reads it once, so a write at run time moves nothing."""
        from .probes.machine import gtt_total, ttm_limit

        pages = -(-want // 4096)
        found, limit = gtt_total(self.root), ttm_limit(self.root)
        if found is None:
            self._failed(
                "gpu window",
                "no GTT from amdgpu (mem_info_gtt_total): the amdgpu driver is not loaded",
                ("sudo modprobe amdgpu   # or see why it did not load: sudo dmesg | grep -i amdgpu",),
                host=True,
            )
            return
        card, live = found
        if live >= want:
            self._passed("gpu window", f"amdgpu's GTT is {gib(live)} GiB ({card}): the plan needs {gib(want)} GiB",
                         host=True)  # fmt: skip
            return
        module = limit.module if limit is not None else "ttm"
        pending = ""
        if limit is not None and limit.bytes >= want:
            pending = (
                f" ({module}.pages_limit already asks for {gib(limit.bytes)} GiB: it takes effect at the next boot)"
            )
        self._failed(
            "gpu window",
            f"amdgpu's GTT is {gib(live)} GiB ({card} mem_info_gtt_total), the plan needs {gib(want)} GiB{pending}",
            (
                self._apply,
                f"(it writes the {module} option to modprobe.d; add {module}.pages_limit={pages} to the kernel command "
                "line too: kernel/README.md), then reboot: amdgpu sizes its GTT once, when it loads",
            ),
            host=True,
            reboot=True,
        )

    def _rocm(self) -> None:
        """Strix Halo: kernel, MES firmware, gfx target vs a ROCm build, the devices a Vulkan build sees (umemc.runtime
        .rocm)."""
        from .rocm import check

        llama = {n: m.argv[0] if m.argv else None for n, m in self.plan.models.items() if m.runtime == "llama-server"}
        env = {n: m.env for n, m in self.plan.models.items()}
        self.findings += check(self.root, llama, env, self.plan.platform.gpu_window_bytes)

    def _apple_window(self, want: int) -> None:
        """The GPU's wired limit in force against the stack's GPU window: iogpu.wired_limit_mb where it is set, else
        macOS's default (Metal's recommendedMaxWorkingSetSize where Metal answers, else the table of measured Macs).
        A smaller limit makes Metal refuse allocations the budget allows."""
        from .probes.machine import metal_working_set

        sysctl = self.sysctl or CommandSysctl()
        mb, memsize = _int(sysctl.get("iogpu.wired_limit_mb")), _int(sysctl.get("hw.memsize"))
        metal = metal_working_set() if not mb else None
        default = metal or (default_wired_limit(memsize) if memsize else None)
        in_force = (mb << 20) if mb else default
        whose = "Metal's recommendedMaxWorkingSetSize" if metal else "macOS's default GPU wired limit"
        if mb:
            said = f"iogpu.wired_limit_mb = {mb}"
        else:
            said = f"iogpu.wired_limit_mb = 0: {whose} (about {gib(default or 0)} GiB)"
        fix = f"sudo sysctl iogpu.wired_limit_mb={-(-want >> 20)}"
        if mb is None:
            said = "this macOS has no iogpu.wired_limit_mb (it came with macOS 14)" + (
                f": {whose} is about {gib(default)} GiB" if default else ""
            )
            fix = "update to macOS 14 or later, or make the stack's gpu_window fit the default limit"
        if in_force is not None and in_force >= want:
            self._passed("gpu window", f"{said} covers the plan's GPU window ({gib(want)} GiB)", host=True)
            return
        self._failed(
            "gpu window",
            f"{said}: the GPU may wire less than the plan's GPU window ({gib(want)} GiB)",
            (fix, f"persist across boots: {self._apply}"),
            host=True,
        )

    def _swap(self) -> None:
        assert self.box is not None
        swap = self.box.swap()
        if self.plan.platform.kind == "apple":
            self._mac_swap(swap.used if swap else 0)
            return
        if swap is None or swap.total == 0:
            self._passed("swap", "no swap: nothing pages the models out")
        else:
            self._failed(
                "swap",
                f"swap is on ({gib(swap.total)} GiB, {gib(swap.used)} GiB used): idle workers "
                "may be paged out (first token 1.2 s -> 18 s in the field notes)",
                ("sudo swapoff -a   # or keep it, with vm.swappiness low",),
                advisory=True,
            )

    def _mac_swap(self, used: int) -> None:
        """macOS compresses and swaps instead of killing (swap cannot be turned off): room on the VM volume keeps a
        stack that outgrows memory slow rather than stopped, and umemc reports swap that grows (event swapping)."""
        where = self.swap_volume()
        free = self.swap_room(where)
        want = max(MAC_SWAP_DISK, self.plan.platform.memory_bytes // 8)
        now = f"{gib(used)} GiB in swap now; umemc reports swap that grows while the stack runs"
        if free is None:
            self._passed("swap", f"the room for swap files in {where} was not recorded with this machine ({now})")
            return
        if free >= want:
            self._passed("swap", f"{gib(free)} GiB free for swap files in {where} ({now})")
            return
        self._failed(
            "swap",
            f"only {gib(free)} GiB free in {where}, where macOS keeps its swap files: under pressure it then kills "
            f"programs or stops with 'Your system has run out of application memory' ({now})",
            (f"free at least {gib(want)} GiB on that volume",),
            advisory=True,
        )

    def _cgroups(self) -> None:
        if self.plan.platform.kind == "apple":
            interval = f"{self.plan.policy.sample_interval_s * 1000:g} ms"
            self._passed(
                "cgroups",
                f"no kernel enforcement on macOS (no memory cgroups): umemc's enforcer kills a worker over its hard "
                f"quota within a sample ({interval}), by its phys_footprint",
            )
            return
        if self.plan.policy.kernel_enforcement == "off":
            return
        from .cgroups import detect

        backend, reason = detect("umemc-preflight-probe")
        if backend is None:
            self._failed(
                "cgroups",
                f"no kernel enforcement ({reason}); the enforcer's sampling still applies the hard quotas",
                ("run under systemd with Delegate=yes (umemc apply), or as root",),
                advisory=True,
            )
        else:
            self._passed("cgroups", f"kernel enforcement: {reason}")

    def _files_and_executables(self) -> None:
        for name, m in self.plan.models.items():
            for key, path in (("model", m.model_file), ("mmproj", m.mmproj_file)):
                if path is not None and not Path(path).exists():
                    self._failed("files", f"models.{name}: {path} does not exist", self._download(m, key))
            if m.needs_model_file and m.model_file is None:
                self._failed(
                    "files",
                    f"models.{name}: no model file (the stack gives only an arch preset)",
                    (f'set models.{name}.model = "path/to/file.gguf" (or hf = "owner/repo/file.gguf")',),
                )
        failing: dict[tuple[str, str], list[str]] = {}  # one finding per program and problem, naming its models
        for name, m in self.plan.models.items():
            problem = _comfyui_checkout(m) if m.runtime == "comfyui" else None
            problem = problem or check_executable(m)
            if problem and m.part_of is not None:  # an RPC server holding a part of a split model
                self._failed(
                    "executables",
                    f"models.{m.part_of}.split: the RPC server of its part on this node: {problem}",
                    (RPC_INSTALL,),
                )
            elif problem:
                failing.setdefault((m.runtime, problem), []).append(name)
        for (runtime, problem), names in failing.items():
            models = ", ".join(f"models.{n}" for n in names)
            built = own_build(runtime) if problem.endswith(" not found") else None
            fix: tuple[str, ...] = (INSTALL.get(runtime, f"install {runtime}"),)
            if built is not None:  # the checkout's own build, which PATH does not reach
                fix = (
                    f'export PATH="{built.parent}:$PATH"   # the {runtime} `python3 dev.py setup-llama-server` built',
                    f'or set bin = "{built}" in {models}',
                )
            self._failed("executables", f"{models}: {problem}", fix)

    def _download(self, m: ModelDoc, key: str) -> tuple[str, ...]:
        if ("hf" if key == "model" else "mmproj_hf") in m.hub_files and self.plan.stack_file:
            return (umemc_command("pull", self.plan.stack_file),)
        return (
            "download each file to the path shown, or name it on the Hugging Face Hub "
            '(hf = "owner/repo/file.gguf", mmproj_hf = …) and `umemc pull` fetches it',
        )

    def _slots_disk(self) -> None:
        """Room on disk for the KV slots the gateway saves before evicting a llama-server (each at most its
        model's KV cache), in the run's state dir."""
        need = sum(m.kv_bytes for m in self.plan.models.values() if m.kv_slots)
        if not need:
            return
        state = RunDir.of_bundle(self.bundle).state
        where = state if state.exists() else self.bundle.resolve().parent
        free = shutil.disk_usage(where).free
        if free >= need:
            self._passed("slot disk", f"{gib(free)} GiB free in {where} for {gib(need)} GiB of saved KV slots")
        else:
            self._failed(
                "slot disk",
                f"{gib(free)} GiB free in {where}, saving every llama-server's KV slots may take {gib(need)} GiB: "
                "a save that does not fit fails (event slot_save_failed) and that chat re-reads its history",
                ("free disk space there, or give --run-dir a larger disk",),
                advisory=True,
            )

    def _helpers(self, running: Collection[str]) -> None:
        """A model split across nodes loads its layers into the RPC servers of its other nodes: they must answer
        before it starts (its exec wrapper would wait a minute at each of supervisord's tries)."""
        from .wrap import silent

        for name, m in self.plan.models.items():
            if not m.rpc or name in running:
                continue
            away = silent(m.rpc, 1.0)
            if away:
                self._failed(
                    "helpers",
                    f"models.{name}.split: the RPC servers of its other nodes do not answer ({', '.join(away)})",
                    ("start the stack on those nodes first (umemc up STACK --node NAME there), or start anyway "
                     "with --skip helpers: the model waits for them",),
                )  # fmt: skip
            else:
                self._passed("helpers", f"models.{name}: the RPC servers of its other nodes answer")

    def _ports(self, running: Collection[str]) -> None:
        ports = {m.port: f"models.{n}" for n, m in self.plan.models.items() if m.port is not None and n not in running}
        gw = self.plan.gateway
        if gw and GATEWAY not in running:
            ports[gw.port] = "gateway"
        if not ports:  # every port is its running program's (a reconcile): nothing to say
            return
        busy = [f"{owner}: port {port} is in use" for port, owner in sorted(ports.items()) if not port_free(port)]
        if busy:
            self._failed("ports", "; ".join(busy), ("stop what listens there (ss -ltnp), or change the port",))
        else:
            self._passed("ports", f"{len(ports)} ports free")

    def _gateway_token(self) -> None:
        gw = self.plan.gateway
        if not gw or not gw.token_env:
            return
        name = gw.token_env
        if os.environ.get(name):
            self._passed("gateway", f"bearer token from ${name}")
        else:
            self._failed(
                "gateway",
                f"gateway.token_env names {name}, which is not set (or empty) here; `umemc "
                "up` hands the token to the gateway (never to the workers) and the gateway refuses to start "
                "without it",
                (f'export {name}="$(openssl rand -hex 24)"  # then give the token to your clients',),
            )


# Which side of the planned value is at least as safe for the stack: a larger free-memory reserve,
# more map areas or earlier kswapd wake-ups, or less eagerness to swap or to drop file caches, never
# need lowering (or raising) back to the plan. Every other tunable must equal the plan.
AT_LEAST = frozenset({"vm.min_free_kbytes", "vm.max_map_count", "vm.watermark_scale_factor"})
AT_MOST = frozenset({"vm.swappiness", "vm.vfs_cache_pressure"})


def sysctl_shortfall(key: str, live: str, want: str) -> str | None:
    """None when the live value is the planned one or on its safe side; else what the plan needs."""
    live_n, want_n = " ".join(live.split()), " ".join(want.split())
    if live_n == want_n:
        return None
    if key in AT_LEAST | AT_MOST and live_n.lstrip("-").isdigit() and want_n.lstrip("-").isdigit():
        if key in AT_LEAST:
            return None if int(live_n) >= int(want_n) else f"at least {want_n}"
        return None if int(live_n) <= int(want_n) else f"at most {want_n}"
    return want_n


def parse_sysctl_conf(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def read_sysctl(key: str, proc_sys: str = "/proc/sys") -> str | None:
    try:
        return Path(proc_sys, *key.split(".")).read_text().strip()
    except OSError:
        return None


def port_free(port: int) -> bool:
    """Free to listen on, as a server would bind it (SO_REUSEADDR: connections of a previous server
    lingering in TIME_WAIT do not make the port busy)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


MAC_SWAP_DISK = 16 << 30  # free space kept for macOS's swap files at least (or an eighth of RAM)


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value.split()[0])
    except (ValueError, IndexError):
        return None


CARVEOUT_SLACK = 1 << 30  # the 512 MB minimum frame buffer and the driver's own rounding are no carve-out


def apu_carveout(root: Path) -> int | None:
    """The VRAM of the AMD integrated GPU, in bytes (None: no AMD APU here). An APU is an AMD display device
    with a GTT whose PCI device id is an APU's, or whose VRAM is a few GiB at most."""
    from .probes.drm import amd_apu_cards

    cards = amd_apu_cards(root)
    return cards[0][1] if cards else None


def own_build(runtime: str) -> Path | None:
    """The llama-server a checkout's `python3 dev.py setup-llama-server` built beside umemc's own environment
    (VENV/llama-server/bin), where there is one: a README user's PATH has only the venv's bin."""
    if runtime != "llama-server":
        return None
    built = Path(sys.prefix) / "llama-server" / "bin" / "llama-server"
    return built if built.is_file() and os.access(built, os.X_OK) else None


# how to get each runtime (the first line of its fix)
RPC_INSTALL = (
    "build llama.cpp with its RPC backend (cmake -DGGML_RPC=ON): ggml-rpc-server goes beside llama-server (the "
    "model's bin), else on PATH"
)
INSTALL = {
    "llama-server": "install llama.cpp's llama-server (a release of github.com/ggml-org/llama.cpp, or your "
    "distribution's package) and put it on PATH, or set each model's bin to it",
    "llama-cpp-python": "pip install 'llama-cpp-python[server]' (or set each model's bin to the python that has it)",
    "whisper-server": "install whisper.cpp's whisper-server (github.com/ggml-org/whisper.cpp) and put it on PATH, or "
    "set each model's bin to it",
    "comfyui": "clone ComfyUI (github.com/comfyanonymous/ComfyUI) and set each model's cwd to the checkout, and bin "
    "to the python of its environment",
    "torch": "pip install torch into umemc's environment (or set each model's bin to a python that has it)",
}


def _comfyui_checkout(m: ModelDoc) -> str | None:
    """ComfyUI runs `main.py` from its checkout: the model's cwd (default: the stack file's directory)."""
    where = Path(m.cwd) if m.cwd else None
    if where is None or not (where / "main.py").is_file():
        return (
            f"no ComfyUI checkout at {where}: its cwd must be the directory that holds ComfyUI's main.py"
            if where
            else "no cwd: ComfyUI runs main.py from its checkout"
        )
    return None


def check_executable(m: ModelDoc) -> str | None:
    """None when argv[0] exists and its --help lists every pinned flag of the runtime."""
    exe = m.argv[0] if m.argv else ""
    if not exe or (shutil.which(exe) is None and not Path(exe).is_file()):
        return f"{exe or '(none)'} not found"
    if not m.pinned_flags:
        return None
    from ..helptext import Help, installed, probe

    described: Help | None
    module = m.help_argv[2] if m.help_argv[1:2] == ["-m"] and len(m.help_argv) == 4 else None  # `python -m MODULE`
    if m.help_argv[1:] == ["--help"] or module is not None:
        described = probe(m.help_argv[0], module)
    else:  # a script's own --help (ComfyUI's main.py), run from the worker's directory
        try:
            done = subprocess.run(m.help_argv, capture_output=True, text=True, timeout=120, check=False, cwd=m.cwd)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{shlex.join(m.help_argv)}` failed: {exc}"
        described = Help(shlex.join(m.help_argv), "unknown", done.stdout + done.stderr)
    if described is None:
        if module is not None and not installed(m.help_argv[0], module):
            top = module.split(".")[0]
            return (
                f"`{shlex.join(m.help_argv)}` failed: {m.help_argv[0]} cannot import {top} "
                f"(pip install '{m.runtime}[server]' into that interpreter's environment)"
            )
        return f"`{shlex.join(m.help_argv)}` failed"
    version = described.version
    missing = [f for f in m.pinned_flags if not described.has(f)]
    if missing:
        return (
            f"`{shlex.join(m.help_argv)}` does not list {', '.join(missing)}: this bundle was spelled for another "
            f"{m.runtime} than the one installed (version {version}); `umemc up STACK` builds it for that one"
        )
    return None
