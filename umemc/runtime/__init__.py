"""What `umemc up` runs: supervisord with the bundle, the enforcer, the exec wrapper, placeholders.
Reads plan.json only; never the TOML."""

import sys


def without_tls() -> None:
    """For a process of umemc's own that never speaks TLS (supervisord, the enforcers: unix sockets, /proc, local
    files), called first: Python's ssl module is kept out, so http.client (XML-RPC's transport) does not load
    OpenSSL (~5 MiB resident a process). Where something already imported it, it stays. Not the gateway's: uvloop
    and asyncio import ssl themselves."""
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
