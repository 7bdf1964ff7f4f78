"""The exec wrapper's entry by path: `python -I -S .../umemc/runtime/wrap_entry.py ARGS` runs umemc.runtime.wrap.

Every worker, the enforcer, the gateway and supervisord start through the wrapper, and a cold start waits for it:
without Python's site step (-S) the interpreter starts in a third of the time (the site step reads every .pth
file of the environment, an editable install's import hook among them). Without site, umemc is found here: the
directory holding this package goes first on sys.path. The wrapper imports nothing outside the standard library
on Linux; where it asks psutil (macOS, and other platforms), umemc.runtime.probes.host runs the site step first.
"""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from umemc.runtime.wrap import main

    sys.exit(main())
