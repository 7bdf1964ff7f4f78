"""Every bundle file, one small pure renderer each: Bundle -> {relative path: text}."""

from __future__ import annotations

from collections.abc import Callable
from xml.sax.saxutils import escape as xml_escape

from .. import contract as c
from ..budget.plan import ModelPlan
from ..catalog.runtimes import KIND_OF_FAMILY, LLAMA_RUNTIMES
from ..compile.bundle import Bundle
from ..compile.launchers import help_argv, runtime_of
from ..names import PLAN_FILE, STATE, SUPERVISOR_CONFIG
from .jinja import render
from .report import budget_json, budget_markdown
from .svg import svg_values

Files = dict[str, str]


def plan_json(b: Bundle) -> Files:
    """plan.json: the runtime's whole input, as the contract's typed model (umemc/contract.py)."""
    plan, p, pol = b.plan, b.plan.platform, b.plan.stack.policy
    gw = plan.stack.gateway
    doc = c.PlanDoc(
        generated_by=b.header,
        stack=plan.name,
        platform=c.PlatformDoc(
            preset=p.preset,
            kind=p.kind,
            memory_bytes=p.memory,
            os_reserve_bytes=p.os_reserve,
            gpu_window_bytes=p.gpu_window,
            cpu_cores=p.cpu_cores,
            uma_carveout_bytes=p.uma_carveout,
        ),
        capacity=c.CapacityDoc(
            usable_bytes=plan.capacity.usable,
            budget_bytes=plan.capacity.budget,
            gpu_budget_bytes=plan.capacity.gpu_budget,
            hot_total_bytes=plan.hot_total,
            hot_gpu_total_bytes=plan.hot_gpu_total,
            fits=plan.fits,
        ),
        policy=c.PolicyDoc(
            safety_margin=pol.safety_margin,
            quota_headroom=pol.quota_headroom,
            sample_interval_s=pol.sample_interval,
            load_below=pol.load_below,
            evict_above=pol.evict_above,
            hsa_enable_sdma=pol.hsa_enable_sdma,
            kernel_enforcement=plan.kernel_enforcement,
            leak_threshold_bytes=pol.leak_threshold,
            leak_window_s=pol.leak_window,
            max_kills=pol.max_kills,
            kill_window_s=pol.kill_window,
            max_generating=pol.max_generating,
            max_generating_throttled=pol.max_generating_throttled,
            restart_fragmented_above=pol.restart_fragmented_above,
            throttle_above_c=pol.throttle_above,
        ),
        gateway=None
        if not gw.enabled
        else c.GatewayDoc(
            host=gw.host,
            port=gw.port,
            token_env=gw.token_env,
            queue=gw.queue,
            queue_timeout_s=gw.queue_timeout,
            start_timeout_s=gw.start_timeout,
            drain_timeout_s=gw.drain_timeout,
            max_body_bytes=gw.max_body,
            header_timeout_s=gw.header_timeout,
            body_timeout_s=gw.body_timeout,
            upstream_timeout_s=gw.upstream_timeout,
            health_interval_s=gw.health_interval,
            memory_bytes=gw.memory,
            loading_progress=gw.loading_progress,
            capture=gw.capture,
            capture_bytes=gw.capture_bytes,
            argv=list(b.gateway),
        ),
        supervisor=c.SupervisorDoc(config=SUPERVISOR_CONFIG, socket=b.socket, state=STATE),
        memlock=b.memlock,
        simulate=b.simulate,
        scale=b.plan.scale,
        stack_file=str(b.plan.path),
        node=b.plan.node,
        peers={m: c.PeerDoc(node=p.node, url=p.url, aliases=list(p.aliases)) for m, p in b.plan.peers.items()},
        enforcer=list(b.enforcer),
        models={name: _model(b, name) for name in b.programs},
    )
    return {PLAN_FILE: c.dump(doc, indent=2) + "\n"}


def _model(b: Bundle, name: str) -> c.ModelDoc:
    prog = b.programs[name]
    m, spec = prog.plan, prog.plan.model.spec
    runtime = runtime_of(m)
    return c.ModelDoc(
        program=name,
        runtime=spec.runtime,
        mode=spec.mode,
        priority=spec.priority,
        model_file=None if m.model.model_path is None else str(m.model.model_path),
        mmproj_file=None if m.model.mmproj_path is None else str(m.model.mmproj_path),
        port=prog.port,
        health=prog.health,
        argv=list(prog.argv),
        wrap=list(prog.wrap),
        env=dict(prog.env),
        cwd=prog.cwd,
        estimate_bytes=m.estimate.estimate_bytes,
        estimate_source=m.estimate.source,
        estimate_parts=c.PartsDoc(
            weights_bytes=m.estimate.weights.bytes,
            kv_bytes=m.estimate.kv.bytes,
            compute_bytes=m.estimate.compute.bytes,
            overhead_bytes=m.estimate.overhead.bytes,
        ),
        quota_soft_bytes=m.quota_soft,
        quota_hard_bytes=m.quota_hard,
        gpu_bytes=m.estimate.gpu.bytes,
        gpu_quota_hard_bytes=m.gpu_quota_hard,
        max_concurrency=m.model.max_concurrency,
        aliases=list(spec.aliases),
        serves=list(spec.serves),
        ttl_s=spec.ttl,
        mlock=spec.mlock,
        needs_model_file=runtime.NEEDS_MODEL_FILE,
        generation_weight=spec.generation_weight,
        kv_slots=spec.parallel if "--slot-save-path" in prog.argv else 0,
        kv_bytes=m.estimate.kv.bytes,
        pinned_flags=list(prog.pinned),
        help_argv=help_argv(m, list(prog.argv)),
        reports_buffers=runtime.REPORTS_BUFFERS,
        hub_files=[k for k in ("hf", "mmproj_hf") if getattr(spec, k) is not None],
        kind=spec.kind or KIND_OF_FAMILY.get(str(m.estimate.facts.get("family")), "other"),
        arch=_fact(m, "arch"),
        quant=_fact(m, "file type") or m.model.quant,
        context=spec.context if spec.runtime in LLAMA_RUNTIMES else None,
        rpc=[p.endpoint for p in m.split.helpers if p.endpoint is not None] if m.split is not None else [],
        part_of=m.part_of,
    )


def _fact(m: ModelPlan, key: str) -> str | None:
    value = m.estimate.facts.get(key)
    return None if value in (None, "") else str(value)


def budget(b: Bundle) -> Files:
    md = f"<!-- {b.header} -->\n" + budget_markdown(b.plan)
    return {
        "budget.json": budget_json(b.plan),
        "budget.md": md,
        "budget.svg": render("budget.svg.j2", bundle=b, **svg_values(b.plan)),
    }


def supervisord(b: Bundle) -> Files:
    return {SUPERVISOR_CONFIG: render("supervisord.conf.j2", bundle=b, state=STATE)}


def env_files(b: Bundle) -> Files:
    return {f"env/{p.name}.env": render("worker.env.j2", bundle=b, p=p) for p in b.programs.values()}


def sysctl(b: Bundle) -> Files:
    """Linux VM tunables; macOS has none of them (its knob is the wired limit, under kernel/apple/)."""
    if b.plan.platform.kind == "apple":
        return {}
    return {"sysctl/90-umemc.conf": render("sysctl.conf.j2", bundle=b)}


def kernel(b: Bundle, *, kubernetes: bool = False) -> Files:
    """The host's kernel and GPU settings; `kubernetes`: for a node whose models the kubelet runs (no
    `umemc up` checks them, no systemd unit runs the stack)."""
    platform = b.plan.platform
    out = {"kernel/README.md": render("kernel/README.md.j2", bundle=b, platform=platform, kubernetes=kubernetes)}
    if b.ttm_pages is not None:
        out["kernel/amd/cmdline.txt"] = render("kernel/amd-cmdline.txt.j2", bundle=b)
        out["kernel/amd/umemc-ttm.conf"] = render("kernel/amd-modprobe.conf.j2", bundle=b)
    if b.wired_limit_mb is not None:
        out["kernel/apple/umemc-wired-limit.sh"] = render("kernel/apple-wired-limit.sh.j2", bundle=b)
        out["kernel/apple/com.umemc.wired-limit.plist"] = render("kernel/apple-wired-limit.plist.j2", bundle=b)
    return out


def systemd(b: Bundle) -> Files:
    """At boot: a systemd unit on Linux; on macOS a LaunchAgent (a Mac someone logs into) and a LaunchDaemon (a
    headless one), placeholders filled by `umemc apply`."""
    if b.plan.platform.kind == "apple":
        name = b.plan.name
        return {
            f"launchd/LaunchAgents/com.umemc.{name}.plist": launchd_plist(name, b.header, daemon=False),
            f"launchd/LaunchDaemons/com.umemc.{name}.plist": launchd_plist(name, b.header, daemon=True),
        }
    return {f"systemd/umemc-{b.plan.name}.service": render("systemd.service.j2", bundle=b)}


LAUNCHD_ARGS = ("@PYTHON@", "-m", "umemc", "up", "--foreground", "--run-dir", "@RUN_DIR@", "@BUNDLE@")
LAUNCHD_FILES = 4096  # supervisord wants 1024 descriptors (its minfds) and launchd's default is 256
LAUNCHD_EXIT_S = 150  # `umemc down`'s own wait (120 s) for the workers to drain and stop, with some to spare


def launchd_plist(name: str, header: str, *, daemon: bool, args: tuple[str, ...] = LAUNCHD_ARGS) -> str:
    """A launchd job that runs the stack in the foreground (launchd supervises supervisord, which supervises the
    workers), written by plistlib so that every path is escaped for XML; `umemc apply` replaces the @...@ values.
    Keys (launchd.plist(5)): KeepAlive restarts it after a crash, not after `launchctl bootout`; ProcessType
    Interactive keeps macOS from throttling it as background work (a model server is latency-bound); ExitTimeOut
    gives the workers time to drain before launchd's SIGKILL; NumberOfFiles what supervisord needs. A daemon runs as
    the user who owns the models (UserName), never as root; its environment's PATH is the installing user's, so
    runtimes found on PATH (Homebrew's llama-server) are found at boot too."""
    import plistlib

    limits = {"NumberOfFiles": LAUNCHD_FILES}
    doc: dict[str, object] = {
        "Label": f"com.umemc.{name}",
        "ProgramArguments": list(args),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Interactive",
        "ExitTimeOut": LAUNCHD_EXIT_S,
        "SoftResourceLimits": limits,
        "HardResourceLimits": limits,
        "EnvironmentVariables": {"PATH": "@PATH@"},
        "WorkingDirectory": "@RUN_DIR@",
        "StandardOutPath": "@LOG@",
        "StandardErrorPath": "@LOG@",
    }
    if daemon:
        doc["UserName"] = "@USER@"
    text = plistlib.dumps(doc, sort_keys=False).decode()
    comment = xml_escape(header).replace("--", "- -")  # "--" may not appear inside an XML comment
    return text.replace("\n", f"\n<!-- {comment} -->\n", 1)


TARGETS: tuple[Callable[[Bundle], Files], ...] = (plan_json, budget, supervisord, env_files, sysctl, kernel, systemd)


def render_bundle(b: Bundle) -> Files:
    files: Files = {}
    for target in TARGETS:
        files.update(target(b))
    return dict(sorted(files.items()))
