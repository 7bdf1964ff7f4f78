"""Model files on the Hugging Face Hub: a stack's `hf = "owner/repo/path/file.gguf"`.

- `ref`: the spelling, checked at load (pure; no network).
- `remote`: what the Hub says of a file (its commit, size and sha256, by HEAD), and its GGUF header read with
  HTTP range requests into a sparse local copy: `check` sizes a 60 GB file exactly from a few MB, and
  llama.cpp's dry run runs on that copy (it reads no weight).
- `download`: `umemc pull`, through huggingface_hub (progress, resume), every part of a split GGUF, each
  verified against the Hub's sha256.

huggingface_hub is imported only here and only when a stack names a Hub file that is not on disk.
"""
