"""Cold start on the real GPU (``pytest -m gpu``): a fresh process's runtime begins loading
the compiled staging loop at ``init``, before any transfer asks for it, and makes a staging
ring ahead for every device (on a two-GPU host, calls go to either), and imports CuPy's error
modes, which every GPU call sets."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

pytestmark = pytest.mark.gpu

# Right after init: loading (or, were it that quick, loaded). A loader that init left alone
# would be neither, and ``calls()`` would only then start it, answering None.
FRESH_PROCESS = """
import json
import sys
import time
import vedart as veda
runtime = veda.init()
loop = runtime.gpu.transfers.loop
began = loop.loading_within() or loop.calls() is not None
loaded = loop.wait(300) is not None
runtime.gpu.transfers.wait_prepared(300)
ring = runtime.gpu.get_memory_stats()["pinned_used_mb"] > 0  # nothing else was moved
every = all(runtime.gpu.transfers.has_idle_ring(ordinal) for ordinal in runtime.gpu.ordinals)
deadline = time.monotonic() + 60  # imported by the loop's loader, though nothing was called
while "cupyx._ufunc_config" not in sys.modules and time.monotonic() < deadline:
    time.sleep(0.01)
error_modes = "cupyx._ufunc_config" in sys.modules
print(json.dumps({"began_at_init": began, "loaded": loaded, "ring_made_ahead": ring,
                  "every_device": every, "error_modes_imported": error_modes}))
"""


def test_init_begins_loading_the_staging_loop_and_making_a_ring_in_a_fresh_process(
        fresh_process: Callable[[str, float], subprocess.CompletedProcess[str]]) -> None:
    finished = fresh_process(FRESH_PROCESS, 400)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout.strip().splitlines()[-1]) == {
        "began_at_init": True, "loaded": True, "ring_made_ahead": True, "every_device": True,
        "error_modes_imported": True}
