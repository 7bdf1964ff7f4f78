"""The stack language: pydantic models with unknown keys forbidden. The JSON Schema in `schema/`
is generated from these (`umemc schema`), so every field carries its description and default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from ..catalog.archs import ARCHS
from ..catalog.quant import KV_TYPES
from ..catalog.runtimes import RUNTIMES
from .presets import KINDS, PLATFORM_PRESETS
from .types import Duration, Size, SysctlValue

NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"

if TYPE_CHECKING:  # the literals are built from the tables at run time; to a type checker they are str
    Runtime: TypeAlias = str
    Arch: TypeAlias = str
    KvCache: TypeAlias = str
    Kind: TypeAlias = str
    PresetName: TypeAlias = str
else:
    Runtime = Literal[RUNTIMES]
    Arch = Literal[ARCHS]
    KvCache = Literal[tuple(KV_TYPES)]
    Kind = Literal[KINDS]
    PresetName = Literal[tuple(PLATFORM_PRESETS)]


class _Strict(BaseModel):
    # strict: TOML is typed, so "8192" for an integer is a mistake to report, not to coerce.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Platform(_Strict):
    preset: PresetName | None = Field(
        None,
        description="A built-in machine: fills kind, memory, os_reserve "
        "and gpu_window; any of them may still be given to override it.",
    )
    kind: Kind | None = Field(None, description="amd-apu | apple | nvidia-unified | nvidia-discrete | cpu.")
    memory: Size | None = Field(None, description="Physical RAM.")
    os_reserve: Size | None = Field(
        None,
        description="Memory kept for the OS and everything outside the stack. "
        "Default: the preset's, else min(8 GiB, memory/8).",
    )
    gpu_window: Size | None = Field(
        None,
        description="What the GPU may map: GTT limit (AMD), wired limit "
        "(Apple), VRAM (discrete). Not used for kind = cpu. Default on "
        "nvidia-unified without a preset: memory - os_reserve.",
    )
    cpu_cores: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="CPU cores, shared among the workers: each llama.cpp worker is given its share by priority "
        "(llama-server -t, llama-cpp-python --n_threads) and other workers OMP_NUM_THREADS. Default: the preset's, "
        "else unset (each runtime's own default: a thread per core each).",
    )
    uma_carveout: Size | None = Field(
        None,
        description="kind = amd-apu: RAM the BIOS reserves for the GPU at boot (its UMA frame buffer, amdgpu's "
        "mem_info_vram_total; `umemc init` reads it). `memory` stays the installed RAM: the GPU then has this "
        "VRAM plus the GTT window (gpu_window), the OS and the models' CPU side the rest. Default: the minimum "
        "(none counted).",
    )


class Node(Platform):
    """One machine of a stack that spans several: the same fields as [platform], plus labels."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Kubernetes node labels that select this machine (default: kubernetes.io/hostname = the name).",
    )
    images: dict[str, str] = Field(
        default_factory=dict,
        description="Container images by runtime on this node (--target kubernetes), e.g. { llama-server = "
        '"registry/llama.cpp:server-cuda-arm64-b9426" } for an arm64 node. A model with its own image of another '
        "name is refused on such a node (pin it to the nodes its image is for).",
    )
    gpu_devices: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="How many models may hold this node's GPU at once: under Kubernetes each GPU model's pod holds "
        "one device of the node's device plugin (NVIDIA time-slicing: GPUs x replicas). Default 1 on a GPU kind; "
        "not counted on apple and cpu.",
    )
    address: str | None = Field(
        None,
        description="The address the other nodes reach this node at (an IP address or host name): where the "
        "llama.cpp RPC servers holding its part of a split model listen. Default 127.0.0.1: every node on one "
        "machine (a rehearsal). The RPC protocol has no authentication: use a private network.",
    )
    rpc_port: int = Field(
        50052,
        ge=1,
        le=65535,
        description="The first port of this node's llama.cpp RPC servers (one per split model it holds a part of, "
        "in the stack's order).",
    )
    gateway_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="The port this node's gateway listens on (default: gateway.port). Each node's gateway answers "
        "for every model of the stack, sending a request for another node's model to that node's gateway at its "
        "address and this port; nodes rehearsed on one machine need one each.",
    )


class Policy(_Strict):
    safety_margin: float = Field(0.15, ge=0, lt=1, description="Share of usable capacity never budgeted.")
    quota_headroom: float = Field(0.10, ge=0, le=10, description="Hard quota = estimate x (1 + quota_headroom).")
    sample_interval: Duration = Field(0.1, ge=0.01, description='Enforcer sampling period (default "100ms").')
    load_below: float = Field(0.70, gt=0, lt=1, description="Cold starts admitted only while pressure is below this.")
    evict_above: float = Field(
        0.90, gt=0, le=1, description="Above this pressure, evict by priority then least-recently-used."
    )
    kernel_enforcement: Literal["auto", "off"] = Field(
        "auto",
        description="auto: each worker also gets a memory "
        "cgroup with its hard quota where the machine allows (cgroup "
        "v2 delegated, or v1); off: the enforcer's sampling only.",
    )
    leak_threshold: Size = Field(
        100 * 1024 * 1024,
        description='Growth per minute that counts as a leak when sustained over leak_window (default "100MiB").',
    )
    leak_window: Duration = Field(300.0, ge=1, description='Sliding window of the leak watch (default "5m").')
    max_kills: int = Field(
        3,
        ge=1,
        le=1000,
        description="Hard-limit kills within kill_window after which the worker is left stopped instead of restarted.",
    )
    kill_window: Duration = Field(600.0, ge=1, description='Window for max_kills (default "10m").')
    max_generating: int | None = Field(
        None,
        gt=0,
        le=4096,
        description="Generations in flight at once across the whole stack (they share one memory bus); each "
        "request takes its model's generation_weight; more wait, highest priority first, then first come. "
        "Default: unlimited.",
    )
    max_generating_throttled: int | None = Field(
        None,
        gt=0,
        le=4096,
        description="max_generating while the box throttles for heat (the GPU driver says so, a sensor is at its own "
        "limit, or at throttle_above): a hot bus runs every model slower, so fewer generate at once. Default: "
        "max_generating throughout.",
    )
    restart_fragmented_above: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Share of a worker's hard quota: while a torch worker's caching allocator has held more than this "
        "beyond its tensors (fragmentation and cache, as umemc.worker reports it), or a llama.cpp worker's processes "
        "more than this beyond the buffers its log states and its overhead, for 5 minutes, the gateway restarts it at "
        "a quiet moment (nothing in flight or queued, no request for a minute). Default: never.",
    )
    throttle_above: float | None = Field(
        None,
        gt=0,
        le=150,
        description="Celsius: any temperature the platform reports at or above this counts as throttling too (for "
        "chips that publish no limit of their own). Default: the chips' own limits and the GPU driver's word only.",
    )
    hsa_enable_sdma: bool = Field(
        False,
        description="AMD: HSA_ENABLE_SDMA for workers. Default false (0): the "
        "practitioners ran Strix Halo with the SDMA copy engines off, which avoided "
        "stalls and corruption seen with them on.",
    )


class Gateway(_Strict):
    enabled: bool = Field(True, description="Run the gateway (a program in the same supervisord).")
    port: int = Field(10000, ge=1, le=65535, description="Port of the OpenAI-compatible gateway.")
    host: str = Field("127.0.0.1", description="Address to bind; anything but loopback requires token_env.")
    token_env: str | None = Field(
        None,
        description="Name of the environment variable holding the bearer token "
        "(never the token itself); when set, every request needs it.",
    )
    queue: int = Field(
        64,
        ge=0,
        le=100_000,
        description="Requests per model that may wait beyond its "
        "max_concurrency (or for its cold start); more are answered 429 with Retry-After.",
    )
    queue_timeout: Duration = Field(
        120.0,
        gt=0,
        description="How long a request may wait for a slot or for "
        'memory before it is answered 503 with Retry-After (default "2m").',
    )
    start_timeout: Duration = Field(
        600.0,
        gt=0,
        description='How long a cold start may take to become healthy (default "10m": big models load for minutes).',
    )
    drain_timeout: Duration = Field(
        30.0,
        gt=0,
        description="How long an eviction waits for the victim's "
        "requests in flight to finish; then the eviction is abandoned, never "
        'the requests (default "30s").',
    )
    max_body: Size = Field(
        32 * 1024 * 1024,
        ge=1024,
        le=4 * 1024**3,
        description="Largest request body "
        'accepted (default "32MiB": an audio upload; OpenAI allows 25 MB); larger ones get 413.',
    )
    header_timeout: Duration = Field(
        15.0,
        ge=1,
        le=3600,
        description="A connection must send a request's "
        "headers within this long, and an idle keep-alive connection is closed "
        'after it (default "15s": slow-header clients cannot hold connections).',
    )
    body_timeout: Duration = Field(
        60.0, ge=1, le=3600, description='A request body must arrive within this long (default "60s").'
    )
    upstream_timeout: Duration = Field(
        600.0,
        ge=1,
        le=86400,
        description="Longest silence from a worker "
        "while it answers a request (no byte for this long: 504, the worker is "
        'marked unhealthy). Default "10m": a long completion without streaming.',
    )
    health_interval: Duration = Field(
        5.0,
        ge=0.1,
        le=3600,
        description="How often the gateway probes each "
        "ready worker's health URL; two failures in a row (2 s timeout each) "
        'mark it unhealthy (e.g. a stopped process). Default "5s".',
    )
    loading_progress: Literal["comment", "reasoning", "off"] = Field(
        "comment",
        description="What a streamed request that waits for a cold start is sent while it waits (what is stopped "
        "to make room, the start, llama-server's own load percentage): comment (default) as event-stream comments, "
        "which OpenAI clients skip; reasoning as chat chunks of reasoning_content, which chat UIs (Open WebUI, "
        "llama.cpp's) show as the model's thinking; off: nothing, the stream begins with the answer.",
    )
    capture: int = Field(
        0,
        ge=0,
        le=1000,
        description="Keep this many of the latest requests and answers for debugging, shown on the status page and "
        "at GET /umemc/captures (default 0: none kept). Bodies only, each cut at capture_bytes; never a header or "
        "the token.",
    )
    capture_bytes: Size = Field(
        4096,
        ge=256,
        le=65536,
        description='How much of each captured request and answer body is kept (default "4KiB").',
    )
    memory: Size = Field(
        512 * 1024 * 1024,
        ge=64 * 1024 * 1024,
        description="Hard memory limit of the gateway "
        "process (its own cgroup, like a worker's). It comes out of os_reserve, not the models' "
        'budget (default "512MiB").',
    )


class ModelSpec(_Strict):
    runtime: Runtime = Field(
        description="llama-server | llama-cpp-python | vllm | mlx | whisper-server | comfyui | torch | command."
    )
    model: str | None = Field(
        None,
        description="Weights file, relative to the stack file. For llama.cpp "
        "runtimes a GGUF whose header gives exact sizes when present; for vllm and mlx a Hugging Face model "
        "directory (config.json and *.safetensors), sized from its files.",
    )
    hf: str | None = Field(
        None,
        description='The model file on the Hugging Face Hub: "owner/repository/path/in/repo.gguf" (a split GGUF by '
        "its first part, NAME-00001-of-0000N.gguf). `umemc pull` downloads it to `model` (default "
        "models_dir/owner/repository/path); until then its GGUF header, read from the Hub with range requests "
        "(a few MB), gives the exact sizes.",
    )
    hf_revision: str | None = Field(
        None, description='The Hub revision of `hf` and `mmproj_hf`: a branch, a tag or a commit (default "main").'
    )
    mmproj_hf: str | None = Field(
        None, description="The vision projector on the Hub, like `hf`; `umemc pull` downloads it to `mmproj`."
    )
    arch: Arch | None = Field(None, description="Built-in architecture preset, used when the model file is absent.")
    quant: str | None = Field(
        None,
        description="GGUF file type (Q4_K_M, Q8_0, F16, ...), whisper.cpp type "
        "(f16, q8_0, ...) or torch dtype (fp16, bf16, fp32, int8). Default: the file's "
        "own type, else the preset's default.",
    )
    min_quant: str | None = Field(
        None,
        description="The lowest GGUF file type umemc's advice may suggest for this model (Q4_K_M, IQ3_M, Q2_K...). "
        "Default: Q8_0 for embeddings, Q5_K_M for vision models, and for language models by size: IQ2_XXS from "
        "100B parameters, IQ3_XXS from 25B, Q3_K_M below.",
    )
    context: int = Field(4096, gt=0, le=16_777_216, description="Tokens per sequence.")
    parallel: int = Field(
        1, gt=0, le=1024, description="Concurrent sequences (llama-server -np); KV is sized for all of them."
    )
    kv_cache: KvCache = Field("f16", description="KV cache type (-ctk/-ctv).")
    flash_attn: bool = Field(True, description="Flash attention (-fa on|off).")
    ubatch: int = Field(512, gt=0, le=65536, description="Physical batch (llama-server -ub).")
    mlock: bool = Field(False, description="Lock the weights in RAM (--mlock); locked memory is fully budgeted.")
    prompt_cache: Size = Field(
        0,
        description="llama-server: host memory for its cache of recent prompts' KV (--cache-ram), counted in the "
        "model's overhead. Default 0: off (llama-server's own default would let the cache grow to 8 GiB beyond "
        "the budget).",
    )
    mmap: bool | None = Field(
        None, description="Memory-map the weights. Default: false on unified-memory platforms (--no-mmap), true on cpu."
    )
    priority: int = Field(50, ge=0, le=100, description="0-100; higher survives eviction longer.")
    mode: Literal["hot", "cold"] = Field("hot", description="hot: started by `umemc up`; cold: started on demand.")
    max_concurrency: int | None = Field(
        None, gt=0, le=4096, description="Requests in flight at once; more wait in a bounded queue. Default: parallel."
    )
    generation_weight: float = Field(
        1.0,
        gt=0,
        le=4096,
        description="Share of policy.max_generating one request of this model takes while it runs (default 1).",
    )
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Worker port. Default: assigned from 10001 upward in file order, skipping ports used explicitly.",
    )
    memory: Size | None = Field(
        None, description="Explicit size of the whole worker; overrides the estimate. Required for runtime = command."
    )
    gpu: bool | None = Field(
        None,
        description="Whether the worker uses the GPU: counted in the GPU window and, under Kubernetes, given one of "
        "the node's GPU devices (the two go together). false: neither (a CPU-only command worker on a GPU box). "
        "Default: true, a command worker's too (its memory is counted in the GPU window, the safe side, so its "
        "pod holds the device).",
    )
    bin: str | None = Field(None, description="The runtime's executable (default: looked up on PATH).")
    args: list[str] = Field(default_factory=list, description="Extra argv for the runtime.")
    mmproj: str | None = Field(None, description="Vision projector GGUF (llama.cpp multimodal), counted in weights.")
    chat_template: str | None = Field(
        None,
        min_length=1,
        description="llama.cpp runtimes: the chat template, for a GGUF that has none (tokenizer.chat_template) or a "
        'wrong one: a llama.cpp built-in name ("chatml", "gemma", "llama3", ...: llama-server --help lists them) or '
        "a Jinja file (a path ending in .jinja or holding a /, relative to the stack file). llama-server is given "
        "--chat-template or --chat-template-file, llama-cpp-python --chat_format (built-in names it shares only).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for the worker; wins over what umemc sets."
    )
    public_env: list[str] = Field(
        default_factory=list,
        description="Keys of env that are not secret: under Kubernetes they go into a ConfigMap; every other "
        "env value is a Secret's (never written by umemc).",
    )
    command: list[str] | None = Field(
        None,
        min_length=1,
        description='runtime = "command" only: the argv; "{port}" is replaced by the port and "{host}" by the '
        "address to bind (127.0.0.1 under supervisord, 0.0.0.0 in a pod).",
    )
    module: str | None = Field(None, description='runtime = "torch": the Python worker module to run.')
    cwd: str | None = Field(None, description="Working directory of the worker, relative to the stack file.")
    image_size: int = Field(
        1024, ge=64, le=16384, description="Diffusion/vision: image side in pixels (activation estimate)."
    )
    batch: int = Field(1, gt=0, le=1024, description="Torch families: batch size (activation estimate).")
    audio_seconds: float = Field(30.0, gt=0, le=86400, description="Speech: audio length per request in seconds.")
    aliases: list[str] = Field(default_factory=list, description="Other names the gateway routes to this model.")
    serves: list[str] = Field(
        default_factory=list,
        description="Names this model shares with other models of the stack, which are then interchangeable: a "
        "request for such a name goes to whichever of them is loaded (the least busy), else to the one cheapest to "
        "start (one that fits without evicting anything, then the quickest measured start, then the smallest). "
        'E.g. serves = ["coder"] on a small and a large coder model.',
    )
    kind: Literal["chat", "embeddings", "audio", "image", "other"] | None = Field(
        None,
        description="What the model serves, as /v1/models says it. Default: from its family (language and vision "
        "models chat, embedding models embeddings, speech audio, diffusion image; a command or torch worker other).",
    )
    ttl: Duration | None = Field(None, description='Idle time after which a cold model is unloaded (e.g. "10m").')
    health: str | None = Field(None, description="Health URL path; overrides the runtime's default.")
    node: str | None = Field(None, description="With [nodes]: the node this model must run on.")
    nodes: list[str] | None = Field(None, description="With [nodes]: the nodes this model may run on (default: any).")
    split: bool = Field(
        False,
        description="With [nodes], llama-server, hot: where no one node holds the model, split it by layers across "
        "its allowed nodes with llama.cpp's RPC backend: the node with the most room runs llama-server, each other "
        "node an RPC server holding its layers (its own quota); the placement chooses the nodes and the layers.",
    )
    image: str | None = Field(
        None, description="Container image for `build --target kubernetes` (default: the runtime's official image)."
    )


class Stack(_Strict):
    version: Literal[1] = Field(description="Stack file format version; this umemc reads 1.")
    name: str = Field(pattern=NAME_PATTERN, description="Stack name; becomes a directory and program-group name.")
    platform: Platform | None = Field(
        None, description="The machine: a preset, or kind + memory. Required unless [nodes] describes several."
    )
    nodes: dict[str, Node] = Field(
        default_factory=dict,
        description="Several machines, by name (^[a-z][a-z0-9_-]{0,62}$), instead of [platform]: models are placed.",
    )
    policy: Policy = Field(default_factory=lambda: Policy(), description="Budget and enforcement policy.")
    gateway: Gateway = Field(default_factory=lambda: Gateway(), description="The OpenAI-compatible gateway.")
    sysctl: dict[str, SysctlValue] = Field(
        default_factory=dict, description='Overrides of the compiled Linux VM tunables, e.g. {"vm.swappiness" = 5}.'
    )
    models_dir: str = Field(
        "models",
        min_length=1,
        description="Where `umemc pull` puts the Hub files of models that name no `model` path, relative to the "
        "stack file.",
    )
    models: dict[str, ModelSpec] = Field(min_length=1, description="The models, by name (^[a-z][a-z0-9_-]{0,62}$).")
