"""Start vedart, configure it three ways, and see what it found.

    python examples/bootstrap_and_configuration.py [--quick]

Settings come from the builder first, then from VEDART_* environment variables, then from
the defaults; `config.sources` says which, for every field.
"""

import os
import subprocess
import sys

import numpy as np

import vedart as veda

# 1. An environment variable, read when a Config is built (here: set by the script itself).
os.environ["VEDART_THREADS"] = "2"

# 2. The builder: wins over the environment.
config = veda.Config.builder().gpu(True).offload_threshold("2MB").build()
runtime = veda.init(config)
for field in ("gpu", "threads", "offload_threshold", "cost_model"):
    print(f"{field:18} {getattr(config, field)!r:12} from {config.sources[field]}")
assert config.sources["threads"] == "env:VEDART_THREADS" and config.threads == 2
assert config.sources["gpu"] == "builder" and config.offload_threshold == 2_000_000

# 3. What the runtime found.
if runtime.gpu:
    names = ", ".join(f"{d.ordinal}: {d.name}" for d in runtime.gpu.devices)
    print(f"GPU: {runtime.gpu.device_count} device(s): {names}")
else:
    print(f"GPU: not available ({runtime.gpu.unavailable_reason}); @veda.gpu runs on the CPU")


@veda.gpu
def saxpy(alpha, x, y):
    return alpha * x + y


rng = np.random.default_rng()
x, y = rng.random(1_000_000), rng.random(1_000_000)
assert np.allclose(saxpy(2.0, x, y), 2.0 * x + y)
decision = saxpy.explain(2.0, x, y)
print(f"saxpy on 16 MB: {decision.path} ({decision.reason})")

# A bad value is refused at once, naming the field, the value and what is allowed.
try:
    veda.Config.builder().threads(0)
except veda.ConfigError as error:
    print(f"refused: {error}")

# `vedart info` prints every setting with its source, and the GPUs (or why there is none).
info = subprocess.run([sys.executable, "-m", "vedart", "info"], capture_output=True, text=True,
                      check=True).stdout
print(info.splitlines()[-1])
veda.shutdown()
print("all results match NumPy")
