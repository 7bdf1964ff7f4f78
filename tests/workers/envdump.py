"""A worker that writes its environment to PATH (JSON), then answers every GET on PORT with 200.

python envdump.py PORT PATH
"""

from __future__ import annotations

import json
import os
import sys

from _serve import serve_empty  # beside this script


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    with open(f"{path}.tmp", "w") as f:
        json.dump(dict(os.environ), f)
    os.replace(f"{path}.tmp", path)

    serve_empty(port)


if __name__ == "__main__":
    main()
