"""The Python examples of docs/kernels.md and docs/backends.md run as printed: each document's
blocks in order, as one module file (Numba's on-disk cache needs a source file) run by a fresh
interpreter (the kernel registry is process-wide), here without a GPU and on the lent GPU
machine with one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", ["kernels.md", "backends.md"])
def test_examples_run(page: str, tmp_path: Path) -> None:
    blocks = _BLOCK.findall((DOCS / page).read_text())
    assert blocks
    module = tmp_path / f"docs_{page[:-3]}.py"
    module.write_text("\n".join(f"# --- {page}, example {number}\n{block}"
                                for number, block in enumerate(blocks, 1)))
    done = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", str(module)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
