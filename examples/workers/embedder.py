"""A real torch worker for umemc: a small transformer encoder built from a config with random
weights on CPU (no download), serving OpenAI-style `/v1/embeddings` on the port umemc gives it,
using `umemc.worker` for its quota: the allocator is configured from the quota, the weights are
reserved before they are built (QuotaExceeded instead of an OOM), and the reservation is returned
with the model object.

    [models.embed]
    runtime = "torch"
    module = "embedder"          # run as `python -m embedder` in cwd
    cwd = "workers"
    memory = "700MiB"
"""

from __future__ import annotations

import http.server
import json
import os
import sys

from umemc import worker

CONFIG = {"vocab": 4096, "width": 256, "layers": 4, "heads": 4, "ffn": 1024}


def param_bytes(c: dict[str, int], dtype_bytes: int = 4) -> int:
    per_layer = 4 * c["width"] ** 2 + 2 * c["width"] * c["ffn"] + 9 * c["width"] + c["ffn"]
    return (c["vocab"] * c["width"] + c["layers"] * per_layer) * dtype_bytes


def build(c: dict[str, int]):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(c["width"], c["heads"], c["ffn"], batch_first=True)
    return torch.nn.ModuleDict(
        {
            "embed": torch.nn.Embedding(c["vocab"], c["width"]),
            "encoder": torch.nn.TransformerEncoder(layer, c["layers"], enable_nested_tensor=False),
        }
    ).eval()


def embed(model, text: str) -> list[float]:  # type: ignore[no-untyped-def]
    import torch

    ids = torch.tensor([[b % CONFIG["vocab"] for b in text.encode()[:512]] or [0]])
    with torch.no_grad():
        hidden = model["encoder"](model["embed"](ids))
        vec = torch.nn.functional.normalize(hidden.mean(dim=1), dim=-1)[0]
    return [round(float(x), 6) for x in vec]


def main() -> int:
    worker.configure()  # CPU here: nothing to set, still accounted
    reservation = worker.reserve(param_bytes(CONFIG), what="embedder weights")  # before allocating them
    with worker.device_init():
        model = build(CONFIG)
    reservation.release()
    worker.reserve(worker.nbytes_of(model), owner=model, what="embedder")  # bound to the model's life
    name = worker.quota().model

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok", "reserved_bytes": worker.ledger().reserved})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            if self.path != "/v1/embeddings":
                self._send(404, {"error": {"message": "not found"}})
                return
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            inputs = req.get("input", "")
            items = inputs if isinstance(inputs, list) else [inputs]
            data = [{"object": "embedding", "index": i, "embedding": embed(model, str(t))} for i, t in enumerate(items)]
            self._send(
                200,
                {
                    "object": "list",
                    "model": name,
                    "data": data,
                    "usage": {"prompt_tokens": sum(len(str(t)) for t in items), "total_tokens": 0},
                },
            )

        def log_message(self, *args: object) -> None:
            pass

    quota = worker.quota()  # where to listen: loopback under supervisord, every address in a Kubernetes pod
    port = quota.port or int(os.environ.get("PORT", "8000"))
    http.server.ThreadingHTTPServer((quota.host, port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
