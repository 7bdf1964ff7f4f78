"""The run dir: RUN/bundle (the bundle being run), RUN/state (socket, pid file, logs, events.db,
enforcer status). Unix socket paths are limited to 107 bytes: when RUN/state is too deep, the
socket goes into a short private (0700) directory and RUN/state/socket records where."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOCKET_MAX = 107


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def pidfile(self) -> Path:
        return self.state / "supervisord.pid"

    @property
    def events(self) -> Path:
        return self.state / "events.db"

    @property
    def status(self) -> Path:
        return self.state / "enforcer.json"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def default_socket(self) -> Path:
        return self.state / "supervisor.sock"

    def socket(self) -> Path:
        """Where the running stack's socket is (from the bundle's plan, else the default)."""
        plan = self.bundle / "plan.json"
        if plan.exists():
            sock = json.loads(plan.read_text())["supervisor"]["socket"]
            return Path(sock.replace("%(here)s", str(self.bundle)))
        return self.default_socket()

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)    # the bundle and the state hold environments and the gateway token
        os.chmod(self.state, 0o700)

    def socket_override(self) -> str | None:
        """None when the default socket path fits; else a short private directory's socket."""
        if len(str(self.default_socket().absolute())) <= SOCKET_MAX:
            return None
        record = self.state / "socket"
        if record.exists():
            path = Path(record.read_text().strip())
            if path.parent.is_dir() and path.parent.stat().st_uid == os.getuid():
                return str(path)
        short = Path(tempfile.mkdtemp(prefix="umemc-"))  # mkdtemp makes it 0700
        sock = short / "supervisor.sock"
        self.state.mkdir(parents=True, exist_ok=True)
        record.write_text(f"{sock}\n")
        return str(sock)

    def supervisord_pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid
