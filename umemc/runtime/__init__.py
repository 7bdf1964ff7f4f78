"""What `umemc up` runs: supervisord with the bundle, the enforcer, the exec wrapper, placeholders.
Reads plan.json only; never the TOML."""

import sys


def without_openssl() -> None:
    """For a process of umemc's own that never speaks TLS (supervisord, the enforcers: unix sockets, /proc, local
    files), called first: Python's ssl module is kept out, so http.client (XML-RPC's transport) does not load
    OpenSSL, and hashlib uses Python's own hashes (what these processes hash is a plan of a few KiB): ~5 MiB
    resident a process. Where something already imported them, they stay. Not the gateway's: uvloop and asyncio
    import ssl themselves."""
    for name in ("ssl", "_hashlib"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
