"""`umemc chat MODEL [PROMPT] [--run-dir DIR]`: a quick try of a model of the running stack. The answer streams
through the stack's gateway (its token read from the run dir, as the gateway reads it) as it is generated; what the
gateway says while the model starts (a cold start) goes to stderr. Without PROMPT, a conversation: each line read is
a turn, an empty line or end of input ends it. `--complete`: the text is continued (a completion: what a base model
does well; each line its own), not answered as a chat. Exit 0 answered, 1 refused or unreachable, 2 no running
stack."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RuntimeFailure
from ..runtime.gateway.naming import error_message
from .args import Args
from .up import add_run_dir, no_stack_in


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("chat", help="chat with a model of the running stack through its gateway")
    p.add_argument("model", help="a model of the running stack (a name, an alias or a shared name)")
    p.add_argument("prompt", nargs="?", help="one message; without it, read turns from standard input")
    p.add_argument("--system", help="a system message first")
    p.add_argument(
        "--complete",
        action="store_true",
        help="continue the text instead of answering it (a completion: for a base model, one without a chat template)",
    )
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the model server's)")
    p.add_argument("--max-tokens", type=int, default=512, metavar="N", help="longest answer (default 512)")
    add_run_dir(p, "option")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class ChatArgs(Args):
    model: str
    prompt: str | None
    system: str | None
    complete: bool
    temperature: float | None
    max_tokens: int
    run_dir: str


def run(ns: argparse.Namespace) -> int:
    args = ChatArgs.of(ns)
    port, token = _gateway(Path(args.run_dir).absolute())
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        _turn(port, token, args, messages, args.prompt)
        return 0
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print(f"{args.model}> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        _turn(port, token, args, messages, line.rstrip("\n"))


def _gateway(root: Path) -> tuple[int, str | None]:
    """The running stack's gateway port and its token (None where it has none)."""
    from ..contract import ContractError, PlanDoc, read
    from ..runtime.rundir import RunDir

    run_dir = RunDir(root)
    if not run_dir.plan.exists():
        raise no_stack_in(root, "`umemc chat MODEL --stack NAME`")
    try:
        plan = read(PlanDoc, run_dir.plan)
    except ContractError as exc:
        raise RuntimeFailure(f"{run_dir.plan}: {exc}") from None
    if plan.gateway is None:
        raise RuntimeFailure(f"stack {plan.stack} runs no gateway (gateway.enabled = false): nothing to chat through")
    return plan.gateway.port, run_dir.token() if plan.gateway.token_env else None


def _turn(port: int, token: str | None, args: ChatArgs, messages: list[dict[str, str]], text: str) -> None:
    """One message and its answer, streamed to stdout; the answer joins the conversation (a completion: the text
    and what continues it, each on its own)."""
    body: dict[str, Any] = {"model": args.model, "stream": True, "max_tokens": args.max_tokens}
    if args.complete:
        body["prompt"] = text
    else:
        messages.append({"role": "user", "content": text})
        body["messages"] = messages
    if args.temperature is not None:
        body["temperature"] = args.temperature
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", "/v1/completions" if args.complete else "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeFailure(f"{args.model}: {resp.status} {error_message(resp.read(), 300)}")
        answer = _stream(resp)
    except OSError as exc:
        raise RuntimeFailure(f"the gateway on 127.0.0.1:{port} did not answer: {exc}") from None
    finally:
        conn.close()
    if not args.complete:
        messages.append({"role": "assistant", "content": answer})


def _stream(resp: http.client.HTTPResponse) -> str:
    """Print each piece of the answer as it comes; the gateway's word on a start goes to stderr."""
    said, buf = [], b""
    while chunk := resp.read1(65536):
        buf += chunk
        *events, buf = buf.split(b"\n\n")
        for ev in events:
            if ev.startswith(b": umemc: "):
                print(ev[2:].decode(errors="replace"), file=sys.stderr, flush=True)
            elif ev.startswith(b"data: {"):
                doc = json.loads(ev[6:])
                if "error" in doc:
                    raise RuntimeFailure(str(doc["error"].get("message", doc["error"])))
                for choice in doc.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or choice.get("text")  # a chat's; a completion's
                    if piece:
                        said.append(piece)
                        print(piece, end="", flush=True)
    print(flush=True)
    return "".join(said)
