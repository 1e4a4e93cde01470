"""Every script in examples/ runs to its end without a GPU, in its quick mode.

Each script checks its own results against NumPy (an assertion error fails it) and prints
"all results match NumPy" last. Files whose names start with "_" are modules the scripts
import, not scripts. tools/gpu-check.sh runs the scripts at full size on the GPU machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted(path for path in (Path(__file__).resolve().parent.parent / "examples")
                  .glob("*.py") if not path.name.startswith("_"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda path: path.stem)
def test_example_runs_without_a_gpu(script: Path, tmp_path: Path) -> None:
    root = script.parent.parent
    environment = dict(os.environ, CUDA_VISIBLE_DEVICES="",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(root),
                                                                os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True,
                          text=True, cwd=tmp_path, env=environment, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("all results match NumPy"), done.stdout
