"""A hostile web page and hostile clients against the gateway, over real HTTP: real supervisord, real
placeholder workers (`up --simulate`), the real gateway process. A page on any site can make the
browser send requests to 127.0.0.1 (CSRF) or rebind its own name to 127.0.0.1 (DNS rebinding)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.runtime.conftest import bring_down, bring_up
from tests.runtime.test_gateway import Gateway, model, stack_text

pytestmark = pytest.mark.slow  # a real stack behind a real gateway

LIMITS = (
    'header_timeout = "1s"\nbody_timeout = "1s"\nmax_body = "4KiB"\nupstream_timeout = "2s"\nhealth_interval = "0.2s"\n'
)


def err(message: str, code: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = model("a", mode="hot") + model("b", mode="hot")
    r = bring_up(
        tmp_path_factory.mktemp("attacks"), stack_text("gw-attacks", models, slots=3, gateway=LIMITS), "--simulate"
    )
    try:
        yield Gateway(r)
    finally:
        bring_down(r)


def hot_workers_untouched(gw: Gateway) -> None:
    assert gw.call("GET", "/umemc/leases")[2] == {"leases": []}
    models = gw.run.status()
    assert (models["a"]["state"], models["b"]["state"]) == ("RUNNING", "RUNNING")
    assert not gw.kinds("evict", "lease_grant")


def test_dns_rebinding_foreign_host_refused(gw: Gateway) -> None:
    port = gw.port
    assert gw.call("GET", "/v1/models", headers={"Host": f"evil.example:{port}"})[::2] == (
        403,
        err(
            f"Host 'evil.example:{port}' is not this gateway's address (use 127.0.0.1 or localhost)",
            "forbidden_host",
            "permission_error",
        ),
    )
    lease = {"holder": "page", "bytes": "150MiB", "priority": 90}
    assert gw.call("POST", "/umemc/leases", lease, {"Host": "rebound.attacker.example"})[0] == 403
    hot_workers_untouched(gw)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "127.0.0.1"):
        assert gw.call("GET", "/v1/models", headers={"Host": host})[0] == 200, host


def test_csrf_simple_requests_and_cross_origin_refused(gw: Gateway) -> None:
    lease = json.dumps({"holder": "page", "bytes": "150MiB", "priority": 90}).encode()  # it would evict a and b
    evil = {"Origin": "http://evil.example"}
    assert gw.call("POST", "/umemc/leases", lease, {"Content-Type": "text/plain", **evil})[::2] == (
        403,
        err("cross-origin request from 'http://evil.example' refused", "cross_origin", "permission_error"),
    )
    page = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"}  # a form, as every browser sends one
    assert gw.call("POST", "/umemc/leases", lease, {"Content-Type": "text/plain", **page})[::2] == (
        415,
        err("Content-Type 'text/plain' is not accepted here: send application/json", "unsupported_media_type"),
    )
    assert gw.call("POST", "/umemc/leases", lease, evil)[0] == 403  # JSON, foreign Origin
    assert gw.call("POST", "/umemc/leases", lease, {"Sec-Fetch-Site": "cross-site"})[::2] == (
        403,
        err("cross-site request refused (Sec-Fetch-Site: cross-site)", "cross_origin", "permission_error"),
    )
    assert gw.call("POST", "/umemc/leases", lease, {"Origin": "null"})[0] == 403  # sandboxed iframes
    form = {"Content-Type": "application/x-www-form-urlencoded", **page}
    assert gw.call("POST", "/v1/completions", b"model=a&prompt=hi", form)[::2] == (
        415,
        err(
            "Content-Type 'application/x-www-form-urlencoded' is not accepted here: send application/json or "
            "multipart/form-data",
            "unsupported_media_type",
        ),
    )
    assert gw.call("DELETE", "/umemc/leases/l-x", b"x", {"Content-Type": "text/plain", **page})[0] == 415
    hot_workers_untouched(gw)
    # no browser sent these (no Origin, no Sec-Fetch-*): curl -d's JSON, labelled as a form, is read as JSON
    curl = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, done = gw.call("POST", "/v1/completions", {"model": "a", "prompt": "hi", "max_tokens": 2}, curl)
    assert (status, done["model"]) == (200, "a")
    assert gw.call("POST", "/v1/completions", b"model=a&prompt=hi", curl)[::2] == (
        400,
        err("request body is not JSON", "invalid_json"),
    )
    assert gw.call("POST", "/models/load", {"model": "a"}, curl)[0] == 200  # the router's load, as its docs post it
    assert gw.call("POST", "/umemc/leases", lease, curl)[0] == 415  # umemc's own API: JSON that says so, always
    same_origin = {"Origin": f"http://127.0.0.1:{gw.port}", "Sec-Fetch-Site": "same-origin"}
    status, _, granted = gw.call("POST", "/umemc/leases", {"holder": "ok", "bytes": "1MiB"}, same_origin)
    assert (status, granted["evicted"]) == (201, [])
    assert gw.call("DELETE", f"/umemc/leases/{granted['lease']['id']}")[0] == 200
    assert gw.call("GET", "/umemc/health", headers={"Host": "anything.example"})[0] == 200  # liveness only


LEASE_CASES = {
    '{"holder": "h", "bytes": 1, "ttl": NaN}': ("request body is not JSON", "invalid_json"),
    '{"holder": "h", "bytes": 1, "ttl": Infinity}': ("request body is not JSON", "invalid_json"),
    '{"holder": "h", "bytes": 1, "ttl": -Infinity}': ("request body is not JSON", "invalid_json"),
    '{"holder": "h", "bytes": 1, "ttl": 1e308}': (
        '"ttl" must be more than 0 s and at most 604800 s (7 days) (got 1e+308)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": 1, "ttl": 100000000}': (
        '"ttl" must be more than 0 s and at most 604800 s (7 days) (got 100000000)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": 1, "ttl": 0}': (
        '"ttl" must be more than 0 s and at most 604800 s (7 days) (got 0)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": 1, "ttl": [1]}': ('"ttl": not a duration: [1]', "invalid_lease"),
    '{"holder": "h", "bytes": 1, "priority": 100000}': (
        '"priority" must be an integer 0-100 (got 100000)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": 1, "priority": 1e308}': (
        '"priority" must be an integer 0-100 (got 1e+308)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": 1, "priority": true}': (
        '"priority" must be an integer 0-100 (got True)',
        "invalid_lease",
    ),
    '{"holder": "h", "model": "a", "priority": 101}': (
        '"priority" must be an integer 0-100 (got 101)',
        "invalid_lease",
    ),
    '{"holder": "h", "model": "a", "priority": "50"}': (
        "\"priority\" must be an integer 0-100 (got '50')",
        "invalid_lease",
    ),
    '{"holder": "h", "model": 5}': ('"model" must be a model name (got 5)', "invalid_lease"),
    '{"holder": "h", "bytes": 1e308}': ('"bytes": not a size: 1e+308', "invalid_lease"),
    '{"holder": "h", "bytes": 99999999999999999999999}': (
        '"bytes" must be > 0 and at most 1152921504606846976 (got 99999999999999999999999)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": "9999999999999999999999999GiB"}': (
        '"bytes" must be > 0 and at most 1152921504606846976 (got 10737418239999999999999998926258176)',
        "invalid_lease",
    ),
    '{"holder": "h", "bytes": 1, "evil": 1}': (
        "unknown lease field(s): evil (known: bytes, holder, model, priority, ttl, worker)",
        "invalid_lease",
    ),
    '{"holder": "h\\n[x]", "bytes": 1}': (
        '"holder" is required: who asks (e.g. "comfyui"), 1-128 printable characters',
        "invalid_lease",
    ),
    '{"holder": "' + "h" * 129 + '", "bytes": 1}': (
        '"holder" is required: who asks (e.g. "comfyui"), 1-128 printable characters',
        "invalid_lease",
    ),
}


@pytest.mark.parametrize("body", LEASE_CASES, ids=range(len(LEASE_CASES)))
def test_every_lease_field_is_validated(gw: Gateway, body: str) -> None:
    message, code = LEASE_CASES[body]
    assert gw.call("POST", "/umemc/leases", body.encode())[::2] == (400, err(message, code))


DEEP = b"[" * 1500 + b"]" * 1500  # past the C parser's recursion limit, within this max_body
DEEP_MESSAGE = "request body nests more than 64 levels of arrays or objects"


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("POST", "/v1/completions", b'{"model": "a", "prompt": ' + DEEP + b"}"),
        ("POST", "/v1/chat/completions", DEEP),
        ("POST", "/umemc/leases", b'{"holder": "h", "bytes": 1, "x": ' + DEEP + b"}"),
        ("POST", "/umemc/pressure", DEEP),
    ],
    ids=["completions", "chat", "leases", "pressure"],
)
def test_deeply_nested_json_is_a_400_on_every_json_endpoint(gw: Gateway, method: str, path: str, body: bytes) -> None:
    assert gw.call(method, path, body)[::2] == (400, err(DEEP_MESSAGE, "invalid_json"))
    assert gw.complete("a")[0] == 200  # and the gateway serves on


def test_lease_extend_is_validated(gw: Gateway) -> None:
    status, _, granted = gw.call("POST", "/umemc/leases", {"holder": "h", "bytes": "1MiB"})
    lease = granted["lease"]["id"]
    try:
        assert gw.call("POST", f"/umemc/leases/{lease}/extend", b'{"ttl": NaN}')[::2] == (
            400,
            err("request body is not JSON", "invalid_json"),
        )
        assert gw.call("POST", f"/umemc/leases/{lease}/extend", b'{"ttl": 1e308}')[::2] == (
            400,
            err('"ttl" must be more than 0 s and at most 604800 s (7 days) (got 1e+308)', "invalid_lease"),
        )
        assert gw.call("POST", f"/umemc/leases/{lease}/extend", b'{"ttl": 5, "bytes": 1}')[::2] == (
            400,
            err("unknown field(s): bytes (known: ttl)", "invalid_lease"),
        )
    finally:
        assert gw.call("DELETE", f"/umemc/leases/{lease}")[0] == 200


def test_body_limit(gw: Gateway) -> None:
    big = {"model": "a", "prompt": "x" * 8192}
    assert gw.call("POST", "/v1/completions", big)[::2] == (
        413,
        err("request body of 8220 bytes is larger than 4096 bytes (gateway.max_body)", "body_too_large"),
    )
    assert gw.complete("a")[0] == 200


def test_a_declared_body_over_the_limit_is_refused_at_once(gw: Gateway) -> None:
    """Content-Length above max_body: 413 before a byte of the body is waited for (it used to wait for the
    body until body_timeout and answer 408)."""
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    got, _ = raw_exchange(gw.port, head, limit=6, until=b"}}")
    assert got.startswith(b"HTTP/1.1 413 "), got
    assert got.endswith(
        json.dumps(
            err("request body of 1000000 bytes is larger than 4096 bytes (gateway.max_body)", "body_too_large")
        ).encode()
    )


def test_the_umemc_api_takes_only_json_that_says_so(gw: Gateway) -> None:
    """A lease body without a Content-Type was granted; umemc's own API (it grants memory and evicts) now wants
    application/json. The OpenAI routes still take a JSON body that does not say what it is."""
    body = json.dumps({"holder": "typeless", "bytes": "1MiB"}).encode()
    for path in ("/umemc/leases", "/umemc/pressure"):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        got, _ = raw_exchange(gw.port, head + body, limit=6, until=b"}}")
        assert got.startswith(b"HTTP/1.1 415 "), got
    assert not [d for _, _, d in gw.kinds("lease_grant") if d["holder"] == "typeless"]
    body = json.dumps({"model": "a", "prompt": "hi"}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    got, _ = raw_exchange(gw.port, head + body, limit=6, until=b"}]")
    assert got.startswith(b"HTTP/1.1 200 "), got


def test_leases_are_bounded(gw: Gateway) -> None:
    """1,500 one-byte leases were granted, each rewriting and syncing the whole state file: at most 64 live."""
    ids = []
    try:
        for i in range(64):
            status, _, doc = gw.call("POST", "/umemc/leases", {"holder": f"h{i}", "bytes": 1})
            assert status == 201, doc
            ids.append(doc["lease"]["id"])
        assert gw.call("POST", "/umemc/leases", {"holder": "one-too-many", "bytes": 1})[::2] == (
            429,
            err("64 leases are live: release one first (GET /umemc/leases lists them)", "too_many_leases",
                "rate_limit_error"),
        )  # fmt: skip
    finally:
        for lease in ids:
            gw.call("DELETE", f"/umemc/leases/{lease}")
    assert gw.call("POST", "/umemc/leases", {"holder": "again", "bytes": 1})[0] == 201
    gw.call("DELETE", f"/umemc/leases/{gw.call('GET', '/umemc/leases')[2]['leases'][0]['id']}")


def raw_exchange(
    port: int, first: bytes, trickle: bytes = b"", every: float = 0.3, limit: float = 10.0, until: bytes | None = None
) -> tuple[bytes, float]:
    """Send FIRST, then TRICKLE one byte at a time; return (what the server answered before closing, or
    once UNTIL arrived, and the seconds that took)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(every)
    got, t0 = b"", time.monotonic()
    try:
        s.sendall(first)
        for byte in [trickle[i : i + 1] for i in range(len(trickle))] or [b""] * 1000:
            if time.monotonic() - t0 > limit:
                break
            try:
                if byte:
                    s.sendall(byte)
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if until is not None and until in got:
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    finally:
        s.close()
    return got, time.monotonic() - t0


def test_slow_headers_are_cut_off(gw: Gateway) -> None:
    """Slowloris: headers one byte every 0.3 s. header_timeout is 1 s: the connection is closed."""
    start = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n".encode()
    got, took = raw_exchange(gw.port, start, b"X-Slow: " + b"y" * 200)
    assert got == b"" and took < 4, (got, took)
    got, took = raw_exchange(gw.port, b"")  # connect and say nothing
    assert got == b"" and took < 4, (got, took)


def test_slow_body_is_answered_408(gw: Gateway) -> None:
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n"
    ).encode()
    got, took = raw_exchange(gw.port, head + b'{"model": "a"', limit=6, until=b"}}")
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert got.endswith(json.dumps(err("request body not received within 1 s", "body_timeout")).encode())
    assert took < 5


def test_requests_survive_an_unwritable_state_dir(gw: Gateway) -> None:
    state = gw.run.run_dir / "state"
    published = state / "gateway.json"
    while not published.is_dir():  # the gateway's state file can no longer be replaced
        published.unlink(missing_ok=True)
        with contextlib.suppress(FileExistsError):  # the gateway wrote it again in between
            published.mkdir()
    (published / "keep").write_text("")
    try:
        for _ in range(3):
            assert gw.complete("a")[0] == 200
        log = state / "logs" / "umemc-gateway.log"
        gw.run.wait_for(
            lambda: f"umemc-gateway: cannot write {published}" in log.read_text(), what="the gateway to say so"
        )
    finally:
        (published / "keep").unlink()
        published.rmdir()


def all_stopped(pid: int) -> bool:
    """Every thread of the process in the stopped state (/proc/PID/task/TID/stat's third field: T)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            states.append(f.read().rpartition(")")[2].split()[0])
    return all(s == "T" for s in states)


def test_hung_worker_is_marked_unhealthy_and_recovers(stack: Any, capsys: Any) -> None:
    gw = Gateway(stack(stack_text("gw-hung", model("h", mode="hot"), slots=1, gateway=LIMITS), "--simulate"))
    pid = gw.run.status()["h"]["pid"]
    assert gw.complete("h")[0] == 200
    os.kill(pid, signal.SIGSTOP)
    try:
        # kill() returns before the stop takes hold: the kernel wakes one thread to stop the group, and until it
        # runs, the thread serving the gateway's kept-alive connection can still answer a request
        gw.run.wait_for(lambda: all_stopped(pid), what=f"every thread of {pid} to stop")
        assert gw.complete("h")[::2] == (
            504,
            err(
                "worker h did not answer within 2 s (gateway.upstream_timeout); it is marked unhealthy until its "
                "health URL answers again",
                "upstream_timeout",
                "server_error",
            ),
        )
        assert gw.complete("h")[::2] == (
            503,
            err(
                "worker h is not answering (no answer within 2 s); requests are refused until its health URL "
                "answers again",
                "worker_unhealthy",
                "server_error",
            ),
        )
        assert [(m, d["reason"]) for m, _, d in gw.kinds("unhealthy")] == [("h", "no answer within 2 s")]
        published = gw.run.run_dir / "state" / "gateway.json"
        gw.run.wait_for(
            lambda: json.loads(published.read_text())["models"]["h"]["health"] == "unhealthy",
            what="gateway.json to say so",
        )
        capsys.readouterr()
        assert gw.run.cli("status") == 0
        row = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("h "))
        assert "RUNNING (unhealthy)" in row, row
    finally:
        os.kill(pid, signal.SIGCONT)
    gw.run.wait_for(lambda: gw.kinds("recovered"), what="the worker to recover")
    assert gw.complete("h")[0] == 200


def test_unknown_model_names_are_echoed_safely(gw: Gateway) -> None:
    status, _, body = gw.call("POST", "/v1/completions", {"model": "x\n<script>", "prompt": "hi"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert "'x\\n<script>'" in body["error"]["message"]
