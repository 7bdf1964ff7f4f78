"""`umemc apply BUNDLE [--dry-run] [--root DIR] [--launchd agent|daemon] [--user NAME]`: install the host files —
the sysctl file, the kernel/macOS knobs, and what runs the stack at boot (a systemd unit on Linux; on macOS a
LaunchAgent of the user, or a LaunchDaemon running as that user) — printing each action. Commands are argv
lists. Everything needs root but a macOS LaunchAgent, which the user installs alone."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..contract import PlanDoc, read
from ..errors import RuntimeFailure, UsageError
from ..names import PLAN_FILE
from .args import Args


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("apply", help="install a bundle's host files (sysctl, kernel/macOS knobs, systemd unit) as root")
    p.add_argument("bundle", help="a bundle directory written by `umemc build`")
    p.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    p.add_argument(
        "--root",
        metavar="DIR",
        default="/",
        help="install below DIR instead of / and run no command (staging, packaging, tests)",
    )
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="run dir of the stack started at boot (default /var/lib/umemc/<name>; on macOS "
        "~USER/Library/Application Support/umemc/<name>)",
    )
    p.add_argument(
        "--launchd",
        choices=("agent", "daemon"),
        default="agent",
        help="macOS: run the stack as a LaunchAgent while USER is logged in (default), or as a LaunchDaemon from boot "
        "(a headless Mac), as USER either way",
    )
    p.add_argument("--user", help="macOS: the user the stack runs as (default: the one who ran sudo, else you)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Action:
    text: str
    install: tuple[str, str, int] | None = None  # (bundle-relative source or rendered text key, destination, mode)
    argv: tuple[str, ...] | None = None
    directory: str | None = None  # made (0700) when missing
    root: bool = True  # needs root (everything but a macOS LaunchAgent)
    owner: str | None = None  # an installed file's owner, when it is not root's (the user's LaunchAgent)


@dataclass(frozen=True)
class MacUser:
    """Who a macOS stack runs as, and how launchd is asked to run it."""

    name: str
    uid: int
    home: str
    launchd: str = "agent"  # agent | daemon


def plan_actions(
    bundle: Path, plan: PlanDoc, run_dir: str, mac: MacUser | None = None
) -> tuple[list[Action], dict[str, str]]:
    """The actions for this bundle's platform, and any text rendered at install time (the unit, the launchd job)."""
    name, kind = plan.stack, plan.platform.kind
    actions: list[Action] = []
    rendered: dict[str, str] = {}
    if kind != "apple":
        actions += [
            Action("VM tunables", ("sysctl/90-umemc.conf", "/etc/sysctl.d/90-umemc.conf", 0o644)),
            Action("load them", argv=("sysctl", "--system")),
        ]
    if (bundle / "kernel/amd/umemc-ttm.conf").exists():
        pages = (bundle / "kernel/amd/cmdline.txt").read_text().strip()
        actions += [
            Action(
                "GTT limit as a ttm module option",
                ("kernel/amd/umemc-ttm.conf", "/etc/modprobe.d/umemc-ttm.conf", 0o644),
            ),
            Action(
                f"not changed automatically: add `{pages}` to the kernel command line and reboot "
                "(kernel/README.md shows the GRUB commands)"
            ),
        ]
    if (bundle / "kernel/apple/com.umemc.wired-limit.plist").exists():
        plist = "/Library/LaunchDaemons/com.umemc.wired-limit.plist"
        actions += [
            Action("wired limit at every boot", ("kernel/apple/com.umemc.wired-limit.plist", plist, 0o644)),
            Action("load the LaunchDaemon", argv=("launchctl", "bootstrap", "system", plist)),
            Action("wired limit now", argv=("sh", str(bundle / "kernel/apple/umemc-wired-limit.sh"))),
        ]
    if kind == "apple":
        job, filled = _launchd_job(bundle, name, run_dir, mac or mac_user(None))
        actions += job
        rendered.update(filled)
    unit_rel = f"systemd/umemc-{name}.service"
    if kind != "apple" and (bundle / unit_rel).exists():
        umemc = " ".join(_systemd_quote(a) for a in (sys.executable, "-m", "umemc"))
        text = (bundle / unit_rel).read_text().replace("@UMEMC@", umemc)
        text = text.replace("@BUNDLE@", _systemd_quote(str(bundle))).replace("@RUN_DIR@", _systemd_quote(run_dir))
        rendered[unit_rel] = text
        dest = f"/etc/systemd/system/umemc-{name}.service"
        actions += [
            Action("run the stack at boot", (unit_rel, dest, 0o644)),
            Action("reload systemd", argv=("systemctl", "daemon-reload")),
            Action(f"then: systemctl enable --now umemc-{name}"),
        ]
    return actions, rendered


def _launchd_job(bundle: Path, name: str, run_dir: str, mac: MacUser) -> tuple[list[Action], dict[str, str]]:
    """The stack's own launchd job, its @...@ values filled: a LaunchAgent in the user's ~/Library/LaunchAgents
    loaded into their GUI session (gui/UID), or a LaunchDaemon in /Library/LaunchDaemons loaded into the system
    domain and running as the user."""
    import plistlib

    folder = "LaunchDaemons" if mac.launchd == "daemon" else "LaunchAgents"
    rel = f"launchd/{folder}/com.umemc.{name}.plist"
    if not (bundle / rel).exists():
        return [], {}
    doc = plistlib.loads((bundle / rel).read_bytes())
    fill = {
        "@PYTHON@": sys.executable,
        "@RUN_DIR@": run_dir,
        "@BUNDLE@": str(bundle),
        "@LOG@": f"{run_dir}/launchd.log",
        "@PATH@": launchd_path(os.environ.get("PATH", "")),
        "@USER@": mac.name,
    }
    doc["ProgramArguments"] = [fill.get(a, a) for a in doc["ProgramArguments"]]
    for key in ("WorkingDirectory", "StandardOutPath", "StandardErrorPath", "UserName"):
        if key in doc:
            doc[key] = fill.get(doc[key], doc[key])
    doc["EnvironmentVariables"] = {k: fill.get(v, v) for k, v in doc.get("EnvironmentVariables", {}).items()}
    text = {rel: plistlib.dumps(doc, sort_keys=False).decode()}
    # launchd opens the job's log and enters its working directory before it runs it: the run dir must exist
    mkdir = Action("the run dir (launchd's log and working directory)", directory=run_dir, root=False, owner=mac.name)
    if mac.launchd == "daemon":
        dest = f"/Library/LaunchDaemons/com.umemc.{name}.plist"
        return [
            mkdir,
            Action(f"run the stack at boot as {mac.name}", (rel, dest, 0o644)),
            Action("load the LaunchDaemon", argv=("launchctl", "bootstrap", "system", dest)),
        ], text
    dest = f"{mac.home}/Library/LaunchAgents/com.umemc.{name}.plist"
    return [
        mkdir,
        Action(f"run the stack while {mac.name} is logged in", (rel, dest, 0o644), root=False, owner=mac.name),
        Action("load the LaunchAgent", argv=("launchctl", "bootstrap", f"gui/{mac.uid}", dest), root=False),
    ], text


HOMEBREW = ("/opt/homebrew/bin", "/usr/local/bin")  # Homebrew on Apple silicon, and on Intel Macs


def launchd_path(path: str) -> str:
    """PATH for the launchd job: the installer's, with Homebrew's directories (launchd's own PATH has neither, and
    sudo may have reset the installer's), each directory once."""
    dirs = [d for d in path.split(":") if d]
    return ":".join(dict.fromkeys([*HOMEBREW, *dirs, "/usr/bin", "/bin", "/usr/sbin", "/sbin"]))


def mac_user(name: str | None, launchd: str = "agent") -> MacUser:
    """The user a macOS stack runs as: NAME, else the one who ran sudo, else the caller."""
    import pwd

    name = name or os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise UsageError(f"--user {name}: no such user") from None
    return MacUser(entry.pw_name, entry.pw_uid, entry.pw_dir, launchd)


def _systemd_quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "/._-+:@=," for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ApplyArgs(Args):
    bundle: str
    dry_run: bool
    root: str
    run_dir: str | None
    launchd: str
    user: str | None


def run(ns: argparse.Namespace) -> int:
    args = ApplyArgs.of(ns)
    from ..write import is_bundle

    bundle = Path(args.bundle).absolute()
    if not is_bundle(bundle):
        raise UsageError(f"{args.bundle}: not a umemc bundle (run `umemc build STACK -o {args.bundle}` first)")
    plan = read(PlanDoc, bundle / PLAN_FILE)
    mac = mac_user(args.user, args.launchd) if plan.platform.kind == "apple" else None
    run_dir = args.run_dir or _default_run_dir(plan.stack, mac)
    actions, rendered = plan_actions(bundle, plan, run_dir, mac)
    root = Path(args.root)
    staging = root.resolve() != Path("/")
    privileged = args.dry_run or staging or os.geteuid() == 0
    cmd = shlex.join(["sudo", sys.executable, "-m", "umemc", "apply", str(bundle)])
    if not privileged and all(a.root for a in actions):
        raise RuntimeFailure(
            f"umemc apply changes /etc and needs root; run:\n  {cmd}\n"
            f"(or `umemc apply {args.bundle} --dry-run` to see what it would do)"
        )
    left = [a for a in actions if a.root and not privileged]
    for action in actions:
        if action in left:
            print(f"needs root, not done: {action.text}")
            continue
        _do(action, bundle, root, rendered, dry=args.dry_run, staging=staging)
    if left:
        raise RuntimeFailure(f"{len(left)} of the actions above need root; for them run:\n  {cmd}")
    return 0


def _chown(path: Path, owner: str | None, *, staging: bool) -> None:
    """A file or directory of the user's (their LaunchAgent, their run dir), made by root: theirs."""
    if owner is None or staging or os.geteuid() != 0:
        return
    import pwd

    entry = pwd.getpwnam(owner)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _default_run_dir(stack: str, mac: MacUser | None) -> str:
    if mac is None:
        return f"/var/lib/umemc/{stack}"
    return f"{mac.home}/Library/Application Support/umemc/{stack}"


def _do(a: Action, bundle: Path, root: Path, rendered: dict[str, str], *, dry: bool, staging: bool) -> None:
    if a.install is not None:
        rel, dest, mode = a.install
        target = root / dest.lstrip("/")
        print(f"{'would install' if dry else 'install'} {rel} -> {target} (mode {mode:o})  # {a.text}")
        if not dry:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.umemc-tmp")
            if rel in rendered:
                tmp.write_text(rendered[rel])
            else:
                shutil.copyfile(bundle / rel, tmp)
            os.chmod(tmp, mode)
            _chown(tmp, a.owner, staging=staging)
            os.replace(tmp, target)
    elif a.directory is not None:
        target = root / a.directory.lstrip("/")
        print(f"{'would make' if dry else 'make'} {target} (mode 700)  # {a.text}")
        if not dry:
            missing = [d for d in (target, *target.parents) if not d.exists()]
            for d in reversed(missing):  # each one made is the user's, not only the last
                d.mkdir(mode=0o700)
                _chown(d, a.owner, staging=staging)
    elif a.argv is not None:
        shown = shlex.join(a.argv)
        if dry or staging:
            print(f"{'would run' if dry else 'skipped (--root)'}: {shown}  # {a.text}")
            return
        print(f"run: {shown}  # {a.text}")
        done = subprocess.run(list(a.argv), check=False)
        if done.returncode != 0:
            raise RuntimeFailure(f"`{shown}` failed with exit code {done.returncode}")
    else:
        print(f"note: {a.text}")
