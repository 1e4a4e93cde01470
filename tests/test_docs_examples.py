"""Every fenced ```python block of README.md and docs/*.md runs as printed.

Each page's blocks run in order, as one module file (so a later block may use what an earlier
one defined, as a reader following the page would; Numba's on-disk kernel cache also needs a
source file), run by a fresh interpreter (the kernel registry and the runtime are
process-wide, so pages cannot disturb each other). A block that is not meant to run is fenced
```` ```python no-run ```` (docs/index.md states the convention); every other block must run.

Each page runs twice: without a GPU (``CUDA_VISIBLE_DEVICES=""``, as in CI), and, marked
``gpu``, with the machine's GPUs (``pytest -m gpu`` on the GPU machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NO_RUN = "no-run"
_FENCE = re.compile(r"^```python(?P<info>[^\n]*)\n(?P<code>.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of ``text`` not fenced ``no-run``."""
    return [(text.count("\n", 0, match.start()) + 1, match["code"])
            for match in _FENCE.finditer(text) if NO_RUN not in match["info"].split()]


def _pages_with_blocks() -> list[Path]:
    return [page for page in PAGES if python_blocks(page.read_text(encoding="utf-8"))]


def _run_page(page: Path, tmp_path: Path, environment: dict[str, str]) -> None:
    name = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name
    module = tmp_path / f"docs_{page.stem.lower()}.py"
    module.write_text("\n".join(f"# --- {name}, line {line}\n{code}"
                                for line, code in python_blocks(page.read_text(encoding="utf-8"))))
    done = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", str(module)],
                          capture_output=True, text=True, cwd=tmp_path, env=environment,
                          timeout=240, check=False)
    assert done.returncode == 0, f"{name}:\n{done.stderr}"


def _environment(**changes: str) -> dict[str, str]:
    environment = dict(os.environ, **changes)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []))
    return environment


@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda page: page.name)
def test_page_runs_without_a_gpu(page: Path, tmp_path: Path) -> None:
    _run_page(page, tmp_path, _environment(CUDA_VISIBLE_DEVICES=""))


@pytest.mark.gpu
@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda page: page.name)
def test_page_runs_on_the_gpu(page: Path, tmp_path: Path) -> None:
    _run_page(page, tmp_path, _environment())


def test_blocks_are_found_and_no_run_blocks_skipped() -> None:
    text = ("x\n```python\na = 1\n```\n\n```python no-run\nraise SystemExit\n```\n"
            "```bash\nls\n```\n```python\nb = 2\n```\n")
    assert python_blocks(text) == [(2, "a = 1\n"), (12, "b = 2\n")]


def test_a_failing_block_fails_its_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nraise ValueError('the page is wrong')\n```\n")
    with pytest.raises(AssertionError, match="the page is wrong"):
        _run_page(page, tmp_path, _environment())
