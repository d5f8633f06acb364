"""Resolve every extra and the dev tools together and write the exact versions to constraints.txt.

``make constraints`` runs this after pyproject.toml changes. pip resolves as for a fresh
environment (``--dry-run --ignore-installed --report``), keeping every version the current
constraints.txt pins (as pip-tools does: only what is new is resolved; a pin that the new
ranges exclude makes pip say so — remove that line). ``--upgrade`` resolves everything
afresh except torch, which stays at the CPU build (PyPI's default build is the CUDA one).
Run the whole suite after either: a newer release can change behaviour (msgspec 0.23
changed a decode error's wording).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "constraints.txt"
HEADER = """\
# The exact versions streamrag is tested with: every extra and the dev tools, resolved
# together for CPython 3.11 on Linux x86_64. `make` installs with `pip install -c constraints.txt`.
# Regenerate after changing pyproject.toml:  make constraints
# torch is the CPU build (2.13.0+cpu); elsewhere add
#   --extra-index-url https://download.pytorch.org/whl/cpu
# or pip takes PyPI's CUDA build of the same version.
"""


def main() -> None:
    old = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
    torch = re.search(r"^torch==(\S+)$", old, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "held.txt"
        if "--upgrade" in sys.argv[1:]:
            pins.write_text(f"torch=={torch.group(1)}\n" if torch else "")
        else:
            pins.write_text(old)
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
             "-c", str(pins), "--report", str(report), f"{ROOT}[dev,bench]"],
            check=True,
        )
        resolved = json.loads(report.read_text())["install"]
    lines = []
    for item in sorted(resolved, key=lambda i: i["metadata"]["name"].lower()):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if name.lower() != "streamrag":
            lines.append(f"{name}=={version.split('+')[0]}")
    OUT.write_text(HEADER + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(lines)} packages")


if __name__ == "__main__":
    main()
