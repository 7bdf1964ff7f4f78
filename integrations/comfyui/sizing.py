"""How much memory a ComfyUI workflow's models need: the files its loader nodes name (checkpoints, diffusion
models, text encoders, VAEs, LoRAs, ControlNets, upscalers), as ComfyUI holds their weights, plus room for the
sampler's activations. A lease of that size is asked for before the prompt runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# loader node class -> (input holding the file name, ComfyUI's folder kind for it)
LOADERS: dict[str, list[tuple[str, str]]] = {
    "CheckpointLoaderSimple": [("ckpt_name", "checkpoints")],
    "CheckpointLoader": [("ckpt_name", "checkpoints")],
    "UNETLoader": [("unet_name", "diffusion_models")],
    "CLIPLoader": [("clip_name", "text_encoders")],
    "DualCLIPLoader": [("clip_name1", "text_encoders"), ("clip_name2", "text_encoders")],
    "TripleCLIPLoader": [("clip_name1", "text_encoders"), ("clip_name2", "text_encoders"),
                         ("clip_name3", "text_encoders")],
    "VAELoader": [("vae_name", "vae")],
    "LoraLoader": [("lora_name", "loras")],
    "LoraLoaderModelOnly": [("lora_name", "loras")],
    "ControlNetLoader": [("control_net_name", "controlnet")],
    "UpscaleModelLoader": [("model_name", "upscale_models")],
    "CLIPVisionLoader": [("clip_name", "clip_vision")],
}  # fmt: skip
ACTIVATIONS = 2 * 2**30  # sampler activations at 1024x1024, batch 1 (SDXL peaks ~2 GB over its weights)
SLACK = 1.10  # allocator fragmentation and buffers held beside the weights


def workflow_files(prompt: dict[str, Any]) -> list[tuple[str, str]]:
    """(folder kind, file name) of every model file the API-format prompt's loader nodes name."""
    out = []
    for node in prompt.values():
        if not isinstance(node, dict):
            continue
        for key, kind in LOADERS.get(str(node.get("class_type", "")), []):
            name = node.get("inputs", {}).get(key)
            if isinstance(name, str) and (kind, name) not in out:
                out.append((kind, name))
    return out


def lease_bytes(prompt: dict[str, Any], resolve: Callable[[str, str], str | None]) -> tuple[int, list[str]]:
    """Bytes to lease for the prompt, and the files counted. `resolve(kind, name)` gives a file's path (inside
    ComfyUI: folder_paths.get_full_path); a file that cannot be found is left out (ComfyUI reports it)."""
    total, counted = 0, []
    for kind, name in workflow_files(prompt):
        path = resolve(kind, name)
        if path is None or not Path(path).is_file():
            continue
        total += Path(path).stat().st_size
        counted.append(f"{kind}/{name}")
    if not counted:
        return 0, []
    return int(total * SLACK) + ACTIVATIONS, counted
