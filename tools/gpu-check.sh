#!/usr/bin/env bash
# Every GPU-side check in one call, on a GPU machine:
#   installs wheels from .whl/ if present (with --no-index: for a machine without network),
#   records nvidia-smi and `vedart info`, runs `vedart demo` and `pytest -m gpu -v`, every
#   script in examples/ at full size, then the quick benchmarks and the cold-start transfers
#   (bench transfer --cold).
# Logs and JSON go under $OUT (default ./gpu-check-out); with LOGS set to another folder they go
# there and $OUT gets one archive of them, gpu-check.tar.gz (for a machine from which only a
# few files can be copied back). Extra arguments go to pytest.
# Exit status: non-zero if any step failed (every step still runs).
set -u
OUT=${OUT:-$PWD/gpu-check-out}
LOGS=${LOGS:-$OUT}
mkdir -p "$OUT" "$LOGS"
export PYTHONPATH=$PWD
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
failed=0
step() {  # step NAME COMMAND...: run, tee the log to $LOGS/NAME.log, remember failure
  local name=$1; shift
  echo "=== $name: $*"
  "$@" > >(tee "$LOGS/$name.log") 2>&1 || { echo "=== $name FAILED"; failed=1; }
}
step nvidia-smi nvidia-smi
step info python3 -m vedart info
python3 -m vedart info --json > "$LOGS/info.json" 2>/dev/null
step demo python3 -m vedart demo
step pytest-gpu python3 -m pytest -m gpu -v -p no:cacheprovider --junitxml="$LOGS/pytest-gpu.xml" "$@"
for example in examples/[!_]*.py; do
  step "example-$(basename "$example" .py)" python3 "$example"
done
for bench in $(python3 -c "from vedart.cli import QUICK_BENCHMARKS as b; print(*b)" 2>/dev/null); do
  step "bench-$bench" python3 -m vedart bench "$bench" --quick --json "$LOGS/bench-$bench.json"
done
step bench-transfer-cold python3 -m vedart bench transfer --cold --quick \
  --json "$LOGS/bench-transfer-cold.json"
if [ "$(realpath "$LOGS")" != "$(realpath "$OUT")" ]; then
  tar -czf "$OUT/gpu-check.tar.gz" -C "$LOGS" . || failed=1
fi
exit $failed
