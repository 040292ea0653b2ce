"""Type-check the package with mypy, as it is imported.

The package's folders map onto ``dsprof.*`` through setuptools ``package-dir``
(pyproject.toml), which mypy cannot follow; this lays the same mapping out as
symlinks in a temporary directory and checks that tree.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    with tempfile.TemporaryDirectory(prefix="dsprof-typecheck-") as tree:
        mapped = {tuple(package.split(".")) for package in mapping}
        for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
            parts = tuple(package.split("."))
            target = Path(tree, *parts)
            if not any(len(other) > len(parts) and other[: len(parts)] == parts for other in mapped):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(ROOT / folder, target_is_directory=True)
                continue
            # a folder with mapped subpackages inside it: a real directory of links, so that the
            # subpackages' links are made in the temporary tree, never inside the repository
            target.mkdir(parents=True, exist_ok=True)
            for child in (ROOT / folder).iterdir():
                if parts + (child.name,) not in mapped and not (target / child.name).exists():
                    (target / child.name).symlink_to(child, target_is_directory=child.is_dir())
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "dsprof"]
        return subprocess.run(command, cwd=tree, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
