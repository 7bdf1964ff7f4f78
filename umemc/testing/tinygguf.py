"""Tiny real GGUF language models, written with the `gguf` package, for tests and benchmarks.

Random weights are fine: memory depends only on shapes and types (docs/ESTIMATES.md). The files carry
a SentencePiece-style vocabulary with all 256 byte-fallback tokens, so llama.cpp loads them and
can really tokenize and complete any text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ChatML as a Jinja template, as instruct models' files carry it (llama-server renders it with its own Jinja engine)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_TEMPLATE = ""  # TinySpec(chat_template=NO_TEMPLATE): a file without one


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"  # llama | qwen2 (qwen2 adds q/k/v biases)
    n_layer: int = 2
    n_embd: int = 64
    n_ff: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_vocab: int = 320
    n_ctx_train: int = 4096
    ftype: str = "F16"  # F16 | Q8_0 | F32
    tied: bool = False  # no output.weight: the token embedding doubles as the output
    chat_template: str = CHATML  # tokenizer.chat_template, as real chat models carry one ("": none)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


_FILE_TYPE = {"F32": 0, "F16": 1, "Q8_0": 7}


def _vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, CONTROL, BYTE...
    i = 0
    while len(tokens) < n:
        word, k = "", i // 2
        while True:  # a distinct letter string per token: base-26 digits of k
            word = chr(ord("a") + k % 26) + word
            k = k // 26 - 1
            if k < 0:
                break
        tokens.append("\u2581" + word if i % 2 == 0 else word)  # each word with and without a leading space
        types.append(1)
        i += 1
    if n < len(types):
        raise ValueError(f"n_vocab must be at least {len(types)} (3 control + 256 byte tokens)")
    return tokens, [-float(k) for k in range(n)], types


def add_vocabulary(w: Any, n_vocab: int, chat_template: str = CHATML) -> None:
    """A SentencePiece-style vocabulary of n_vocab tokens (the byte-fallback ones included) and a chat template
    ("": none) into a GGUFWriter."""
    tokens, scores, types = _vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    if chat_template:
        w.add_chat_template(chat_template)


def write_tiny_gguf(path: Path, spec: TinySpec, seed: int = 0, split_max_tensors: int = 0) -> Path:
    """Write a loadable GGUF model of the given shape; returns the path. With `split_max_tensors`, a split GGUF
    (gguf-split's layout, written by gguf's own writer): parts of at most that many tensors, named
    PATH-0000k-of-0000N.gguf; the first part's path is returned."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), spec.arch, split_max_tensors=split_max_tensors)
    a = spec.arch
    w.add_name(f"tiny-{a}-{spec.n_layer}x{spec.n_embd}")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(_FILE_TYPE[spec.ftype])
    add_vocabulary(w, spec.n_vocab, spec.chat_template)

    def mat(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        if spec.ftype == "Q8_0":
            w.add_tensor(
                name,
                gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        elif spec.ftype == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, data)

    def vec(name: str, n: int, value: float = 1.0) -> None:
        w.add_tensor(name, np.full((n,), value, dtype=np.float32))

    q, kv = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    mat("token_embd.weight", spec.n_vocab, spec.n_embd)
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", spec.n_embd)
        mat(b + "attn_q.weight", q, spec.n_embd)
        mat(b + "attn_k.weight", kv, spec.n_embd)
        mat(b + "attn_v.weight", kv, spec.n_embd)
        if a == "qwen2":
            vec(b + "attn_q.bias", q, 0.0)
            vec(b + "attn_k.bias", kv, 0.0)
            vec(b + "attn_v.bias", kv, 0.0)
        mat(b + "attn_output.weight", spec.n_embd, q)
        vec(b + "ffn_norm.weight", spec.n_embd)
        mat(b + "ffn_gate.weight", spec.n_ff, spec.n_embd)
        mat(b + "ffn_up.weight", spec.n_ff, spec.n_embd)
        mat(b + "ffn_down.weight", spec.n_embd, spec.n_ff)
    vec("output_norm.weight", spec.n_embd)
    if not spec.tied:
        mat("output.weight", spec.n_vocab, spec.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return next(iter(sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))))
    return path


def main(argv: list[str] | None = None) -> int:
    """python -m umemc.testing.tinygguf OUT.gguf [--layers N --embd N --ff N --heads N --kv-heads N --vocab N
    --ftype T]"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m umemc.testing.tinygguf", description="write a tiny loadable GGUF model")
    p.add_argument("out")
    p.add_argument("--arch", default="llama", choices=("llama", "qwen2"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--ff", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--ftype", default="F16", choices=sorted(_FILE_TYPE))
    a = p.parse_args(argv)
    spec = TinySpec(a.arch, a.layers, a.embd, a.ff, a.heads, a.kv_heads, a.vocab, ftype=a.ftype)
    print(write_tiny_gguf(Path(a.out), spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
