#!/usr/bin/env bash
# Device-side investigation helper: build, then print host backtraces of the
# scripts given as arguments (each a file of Python code) under cuda-gdb.
set -u
export PYTHONUNBUFFERED=1
(MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1) || { tail -30 /tmp/build.log; exit 1; }
for script in "$@"; do
  echo "=== $script"
  timeout 120 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex "bt 30" --args python3 "$script" 2>&1 \
    | grep -E "^#|signal|caught|Error|error" | grep -v "New Thread\|exited" | head -45
done
