"""The names the compiler writes and the runtime reads: umemc's own program names and the file names of a bundle.
Imports nothing but os (loaded with the interpreter): the exec wrapper that starts before every worker reads them,
and a worker's cold start should not wait for pydantic to load (the typed documents are in umemc.contract)."""

import os

# The exec wrapper by path, run as `python -I -S WRAP_ENTRY ...`: with no site step, umemc is found from there
WRAP_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime", "wrap_entry.py")
# The run dir as supervisord's config spells it (%(here)s is the bundle directory): RUN/state beside
# RUN/bundle. Every path inside it is runtime.rundir.RunDir's; these two are what the compiler writes.
STATE = "%(here)s/../state"
# umemc's own processes beside the workers: their program names (supervisord's, the run dir's records) are no
# model's
ENFORCER, GATEWAY, SUPERVISORD = "umemc-enforcer", "umemc-gateway", "umemc-supervisord"
# a second enforcer, its imports done and the plan read, waiting on the run's enforcer lock: it takes over the moment
# the running one dies (the kernel releases its lock), so the quotas hold while supervisord restarts the dead one. A
# program of its own only in a stack without a gateway: with one, it is a thread of the gateway's process
STANDBY = "umemc-enforcer-standby"
ENFORCERS = (ENFORCER, STANDBY)
OWN_PROGRAMS: tuple[str, ...] = (ENFORCER, STANDBY, GATEWAY, SUPERVISORD)
REAPER = "umemc-reaper"  # where no parent-death signal exists: what stops the run when supervisord dies
# every process of a run carries the run's mark in its environment (set by the exec wrapper, inherited): how
# `umemc down` finds them where no cgroup can, and how it kills nothing that is not the run's
RUN_MARK = "UMEMC_RUN"
# the exec wrapper's records in a run's state dir (runtime.rundir.RunDir.pids / .cgroups; the wrapper, which
# imports no pathlib, joins them itself): `pid starttime` and `version path pid` of each program; and the gates
# the gateway leaves a cold start at while the models it evicts are stopping (RunDir.gate)
PIDS_DIR, CGROUPS_DIR, GATES_DIR = "pids", "cgroups", "gates"
# in the state dir: the variables the exec wrapper removes from every program but the gateway (the gateway token's
# name), written by `umemc up`; read at each start, so a new token_env changes no worker's command
SECRETS_DIR, UNSET_FILE = "secrets", "unset-env"
PLAN_FILE = "plan.json"  # in a bundle: what the runtime reads
SUPERVISOR_CONFIG = "supervisord.conf"  # in a bundle: supervisord's configuration
# The control socket is not in the rendered text: supervisord (and supervisorctl) expand it from the
# environment `umemc up` starts them with, RunDir.socket(): RUN/state/supervisor.sock, or a short private
# directory's socket when the run dir is too deep for a unix socket path. A copied bundle is never edited.
SOCKET_ENV = "UMEMC_SUPERVISOR_SOCKET"
SOCKET = f"%(ENV_{SOCKET_ENV})s"


def run_mark(state: str | os.PathLike[str]) -> str:
    """The run's id: its state directory's path (resolved), hashed: the mark in its processes' environment and
    its cgroups' names."""
    return sha256_hex(os.path.realpath(state).encode())[:8]


def sha256_hex(data: bytes) -> str:
    """SHA-256 by Python's own code (_sha256 to 3.11; hashlib elsewhere): hashlib loads OpenSSL, a sixth of the exec
    wrapper's start and ~2 MiB resident in the runtime's processes, which hash only small files (a plan)."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from hashlib import sha256

    return str(sha256(data).hexdigest())
