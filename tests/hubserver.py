"""A local HTTP server that answers as the Hugging Face Hub does for file downloads, for tests (HF_ENDPOINT).

What it answers, and where the format comes from (huggingface_hub's file_download.py and utils/_http.py, which
read these headers; the Hub's documented download behaviour):
- `HEAD|GET /OWNER/NAME/resolve/REVISION/PATH`: for a file kept in LFS, 302 to the file's bytes on a "CDN"
  (`/cdn/SHA256` on another port: another origin) with `X-Repo-Commit` (the 40-hex commit the revision is at),
  `X-Linked-Etag` (the file's sha256, quoted), `X-Linked-Size` and `ETag` (the git object id of the LFS
  pointer). Errors carry
  `X-Error-Code`: `RepoNotFound` (404, or 401 for a private repository without a token), `RevisionNotFound`,
  `EntryNotFound`, `GatedRepo` (403).
- `GET|HEAD /cdn/SHA256`: the bytes, with `Accept-Ranges: bytes`, a `Range: bytes=A-B` answered 206 with
  `Content-Range`.
Knobs for faults: `cut_after` (the first full download is cut off after that many bytes, like a dropped
connection), `stall_after` (downloads stop sending there until `go` is set: a client killed mid-download),
`corrupt` (the last byte differs from the sha256 announced), `token` (a private repository), and a hostile
Hub's: a repository's `commit` (any text), a file's `announced` size (any text), `trickle` (one byte at a time).
Every request is logged with the byte range it asked for and the bytes sent.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


@dataclass
class Hosted:
    path: Path
    sha256: str
    size: int
    corrupt: bool = False
    announced: object = None  # what X-Linked-Size says, where it lies (a larger file, -5, 2**62); None: size


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    sent: int = 0
    authorization: str | None = None


@dataclass
class Repo:
    commit: str
    files: dict[str, Hosted] = field(default_factory=dict)
    branches: tuple[str, ...] = ("main",)
    gated: bool = False


class FakeHub:
    def __init__(self, token: str | None = None):
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.requests: list[Request] = []
        self.cut_after: int | None = None  # cut the next full download of a file after this many bytes
        self.trickle: float | None = None  # file bytes are sent one at a time, this many seconds apart
        self.stall_after: int | None = None  # stop sending a download after this many bytes until `go` is set
        self.stalled = threading.Event()  # set when a download stalls there
        self.go = threading.Event()
        self.lock = threading.Lock()
        # the bytes come from another origin (another port), as the Hub's come from a CDN: huggingface_hub
        # follows a redirect within the Hub but reads the file's metadata off a redirect that leaves it
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self)) for _ in range(2)]
        for server in self.servers:
            server.daemon_threads = True
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.servers[1].server_address[1]}"

    def add(self, repo: str, name: str, file: Path, commit: str = "c0ffee" * 6 + "c0ff") -> Hosted:
        """Host `file` as `name` in `repo` (its sha256 computed here, as the Hub does at upload)."""
        h = hashlib.sha256()
        with file.open("rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        hosted = Hosted(file, h.hexdigest(), file.stat().st_size)
        self.repos.setdefault(repo, Repo(commit)).files[name] = hosted
        return hosted

    def served(self, prefix: str = "/cdn/") -> int:
        """Bytes of file data sent so far."""
        return sum(r.sent for r in self.requests if r.path.startswith(prefix))

    def __enter__(self) -> FakeHub:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"hub": hub})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def do_GET(self) -> None:
        self.answer(body=True)

    def answer(self, body: bool) -> None:
        req = Request(self.command, self.path.split("?")[0], self.headers.get("Range"), 0,
                      self.headers.get("Authorization"))  # fmt: skip
        with self.hub.lock:
            self.hub.requests.append(req)
        if req.path.startswith("/cdn/"):
            self.cdn(req, body)
            return
        repo, file = self.resolve(req)
        if isinstance(repo, int):  # the Hub's error: status, X-Error-Code
            self.error(repo, str(file))
            return
        assert isinstance(file, Hosted)
        self.send_response(302)
        self.send_header("Location", f"{self.hub.cdn_url}/cdn/{file.sha256}")
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("X-Linked-Etag", f'"{file.sha256}"')
        self.send_header("X-Linked-Size", str(file.size if file.announced is None else file.announced))
        self.send_header("ETag", f'"{hashlib.sha1(file.sha256.encode()).hexdigest()}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def resolve(self, req: Request) -> tuple[Repo | int, Hosted | str]:
        """The file a resolve URL names, or the Hub's error for it (status, X-Error-Code)."""
        m = _RESOLVE.match(req.path)
        repo = self.hub.repos.get(m.group("repo")) if m else None
        if self.hub.token is not None and req.authorization != f"Bearer {self.hub.token}":
            return 401, "RepoNotFound"
        if m is None or repo is None:
            return 404, "RepoNotFound"
        if repo.gated:
            return 403, "GatedRepo"
        if m.group("rev") not in (*repo.branches, repo.commit):
            return 404, "RevisionNotFound"
        file = repo.files.get(m.group("path"))
        return (repo, file) if file is not None else (404, "EntryNotFound")

    def error(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def cdn(self, req: Request, body: bool) -> None:
        sha = req.path.removeprefix("/cdn/")
        file = next((f for r in self.hub.repos.values() for f in r.files.values() if f.sha256 == sha), None)
        if file is None:
            self.error(404, "EntryNotFound")
            return
        start, end = 0, file.size - 1
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", req.range or "")
        if m:
            start, end = int(m.group(1)), min(file.size - 1, int(m.group(2) or file.size - 1))
        if m and start >= file.size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{file.size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if m else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{file.size}")
        self.send_header("ETag", f'"{file.sha256}"')
        self.end_headers()
        if body:
            self.send(req, file, start, end)

    def send(self, req: Request, file: Hosted, start: int, end: int) -> None:
        hub = self.hub
        with hub.lock:
            cut = hub.cut_after if start == 0 and end == file.size - 1 else None
            hub.cut_after = None if cut is not None else hub.cut_after
        with file.path.open("rb") as f:
            f.seek(start)
            while (left := end + 1 - f.tell()) > 0:
                at = f.tell()
                chunk = f.read(min(CHUNK, left))
                if file.corrupt and at + len(chunk) == file.size:  # the file's last byte flipped
                    chunk = chunk[:-1] + bytes([chunk[-1] ^ 0xFF])
                if self.hub.trickle is not None:  # a CDN that never stops and never hurries
                    self.dribble(req, chunk)
                    return
                stop = self.stop_at(req, cut, len(chunk))
                if stop is not None:
                    self.stop(req, chunk[: stop - req.sent], cut is not None and stop == cut)
                    return
                req.sent += len(chunk)  # counted before the write: a client that has it may ask `served` at once
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    req.sent -= len(chunk)
                    return  # the client had what it wanted (a header read stops early)

    def dribble(self, req: Request, chunk: bytes) -> None:
        for i in range(len(chunk)):
            req.sent += 1
            try:
                self.wfile.write(chunk[i : i + 1])
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                req.sent -= 1
                return
            time.sleep(self.hub.trickle or 0)

    def stop_at(self, req: Request, cut: int | None, n: int) -> int | None:
        """Where this response stops short: a stall or a cut within the next n bytes."""
        stall = self.hub.stall_after
        if stall is not None and req.sent + n > stall and not self.hub.go.is_set():
            return stall
        if cut is not None and req.sent + n > cut:
            return cut
        return None

    def stop(self, req: Request, last: bytes, dropped: bool) -> None:
        req.sent += len(last)
        self.wfile.write(last)
        self.wfile.flush()
        if dropped:  # a dropped connection, mid-body
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.hub.stalled.set()  # a stall: until the test says go (the client is killed meanwhile)
        self.hub.go.wait()
