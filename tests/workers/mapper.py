"""A test worker that maps a file and reads every page of it (as llama.cpp maps a model's weights), then answers
every GET with 200 until stopped.

python mapper.py PORT FILE
"""

from __future__ import annotations

import mmap
import sys

from _serve import serve_empty  # beside this script


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    touched = sum(mapped[i] for i in range(0, len(mapped), 4096))  # every page resident in this process
    print(f"mapper: {len(mapped)} bytes mapped and read ({touched}), serving on {port}", flush=True)
    serve_empty(port)


if __name__ == "__main__":
    main()
