#!/usr/bin/env bash
# Run on the GPU machine (device tool): how much of PyTorch runs on the unified
# device, in one call. Builds the extension, then runs side by side
#   - tests/test_op_db.py and tests/test_module_db.py, their children split
#     over TORCH_DIRECT_OP_DB_WORKERS processes (outcomes: $OUT/op_db.json,
#     $OUT/module_db.json);
#   - build_scripts/run_upstream_tests --device unified over the upstream
#     files (UPSTREAM_FILES, default every listed file), UPSTREAM_JOBS files at
#     a time, UPSTREAM_SAMPLE pairs each ($OUT/upstream_device.json), from the
#     pinned tree in UPSTREAM_TREE (a folder holding test/, carried along: its
#     top-level test_*.py, expect/ and autograd/, which test_autograd imports);
# then the test files given as arguments, through device_suite.sh.
# DB_TIMEOUT=0 or UPSTREAM_TIMEOUT=0 leaves that part out; REUSE_BUILD=1 keeps a
# build a warm machine still has.
# Logs: $OUT/conformance.log and device_suite.sh's $OUT/tests_all.log.
set -u
OUT="${OUT:-$PWD/device_out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
here="$(cd "$(dirname "$0")" && pwd)"
log="$OUT/conformance.log"
tree="${UPSTREAM_TREE:-build/upstream-tree}"
[ -d "$tree/test" ] || { echo "device_conformance: no test/ in $tree (build_scripts/fetch_source, then copy its test/ there)" >&2; exit 2; }
[ -d "$tree/test/autograd" ] || echo "device_conformance: $tree/test has no autograd/: test_autograd.py will not collect" >&2

# Build, and install the carried wheels into /tmp/site.
bash "$here/device_suite.sh" --build-only > "$log" 2>&1
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; fi
python3 -c "import torch_direct; assert torch_direct.built_with_cuda()" || { tail -40 "$OUT/build.log"; exit 1; }

export TORCH_DIRECT_OP_DB_WORKERS="${TORCH_DIRECT_OP_DB_WORKERS:-6}"
t0=$(date +%s)
if [ "${DB_TIMEOUT:-540}" != 0 ]; then
  ( TORCH_DIRECT_OP_DB_OUTCOMES="$OUT/op_db.json" timeout "${DB_TIMEOUT:-540}" \
      python3 -m pytest -q -p no:cacheprovider tests/test_op_db.py > "$OUT/op_db.log" 2>&1
    echo "op_db rc=$? $(( $(date +%s) - t0 ))s :: $(tail -1 "$OUT/op_db.log")" >> "$log" ) &
  ( TORCH_DIRECT_OP_DB_WORKERS=3 TORCH_DIRECT_MODULE_DB_OUTCOMES="$OUT/module_db.json" timeout "${DB_TIMEOUT:-540}" \
      python3 -m pytest -q -p no:cacheprovider tests/test_module_db.py > "$OUT/module_db.log" 2>&1
    echo "module_db rc=$? $(( $(date +%s) - t0 ))s :: $(tail -1 "$OUT/module_db.log")" >> "$log" ) &
fi
files=()
[ -n "${UPSTREAM_FILES:-}" ] && files=(--files "$UPSTREAM_FILES")
[ "${UPSTREAM_TIMEOUT:-540}" != 0 ] && timeout "${UPSTREAM_TIMEOUT:-540}" python3 build_scripts/run_upstream_tests --device unified --tree "$tree" \
  --sample "${UPSTREAM_SAMPLE:-60}" --jobs "${UPSTREAM_JOBS:-6}" --file-timeout "${UPSTREAM_FILE_TIMEOUT:-300}" \
  "${files[@]}" --out "$OUT/upstream_device.json" >> "$log" 2>&1
echo "upstream rc=$? $(( $(date +%s) - t0 ))s" >> "$log"
wait
for f in op_db module_db; do
  [ -f "$OUT/$f.log" ] || continue
  { echo "===== $f"; grep -v "^Extension modules" "$OUT/$f.log" | tail -60; } >> "$log"; rm -f "$OUT/$f.log"
  [ -f "$OUT/$f.json" ] && python3 tests/${f}_runner.py report "$OUT/$f.json" >> "$log" 2>&1
done
[ $# -gt 0 ] && REUSE_BUILD=1 bash "$here/device_suite.sh" "$@"
cat "$log" | grep -E "rc=|run_upstream_tests:|jobs \(|passed|failed" | head -40
