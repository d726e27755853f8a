#!/usr/bin/env bash
# Run on the GPU machine (device tool): build the extension, then run every
# test file (or the files given as arguments) with a time limit each
# (PER_FILE_TIMEOUT, default 300 s), LANES files at a time (default 1), none
# started after DEADLINE seconds (default none). Logs and a one-line-per-file
# summary go to $OUT (default ./device_out). With --build-only it stops after
# the build. The whole suite in one call of the device tool, for example:
#   LANES=5 DEADLINE=480 PER_FILE_TIMEOUT=400 bash experiments/device_suite.sh
#
# A build leaves $OUT/prebuilt.tgz: its extension modules without debug
# information (a few MB) and the digest of what they were built from (the C++
# and CUDA sources, setup.py, the registrations' generator, torch's and Python's
# versions). Carried back in a later call as PREBUILT=path/to/prebuilt.tgz, it
# replaces the build when the digest still matches (about 140 s saved on a
# fresh machine); otherwise the build runs as usual. A machine without a GPU but with nvcc and
# the GPU machine's torch and Python makes the same archive (the digest names their versions):
#   PATH=/path/to/that/venv/bin:$PATH TORCH_DIRECT_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 \
#     OUT=/tmp/prebuilt bash experiments/device_suite.sh --build-only
set -u
OUT="${OUT:-$PWD/device_out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Wheels the machine lacks (no network there), but not the CPU-only torch-scatter
# and torch-sparse that experiments/device_pipeline.sh builds for PyG's NeighborLoader:
# with torch_scatter importable, PyG sends the min/max scatters of CUDA tensors
# (GAT's softmax) to it, and a CPU-only build fails there.
wheels=$(ls .whl/*.whl 2>/dev/null | grep -v -E '/torch_(scatter|sparse)-')
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
t0=$(date +%s)
source_digest() {  # what the extension modules are built from
  { find csrc c10_allocator -type f \( -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' -o -name '*.py' \) \
      ! -path '*/generated/*' | LC_ALL=C sort | xargs sha256sum
    sha256sum setup.py native_functions_additions.yaml tools/gen_registrations.py
    python3 -c "import sys, torch; print(torch.__version__, torch.version.cuda, sys.version_info[:2])"
  } | sha256sum | cut -c1-16
}
built_with_cuda() { python3 -c "import torch_direct, sys; sys.exit(not torch_direct.built_with_cuda())" 2>/dev/null; }
modules() { ls torch_direct/_C.*.so torch_direct/gnn/graph/_sampler.*.so torch_direct/gnn/pipeline/_aggregate.*.so \
  torch_direct/gnn/pipeline/_features.*.so 2>/dev/null; }
digest=$(source_digest)
# REUSE_BUILD=1 on a machine still warm from an earlier call keeps the build
# that is there when it imports with CUDA.
if [ "${REUSE_BUILD:-0}" = 1 ] && built_with_cuda; then
  echo "build: reused"
elif [ -n "${PREBUILT:-}" ] && [ -f "$PREBUILT" ] && [ "$(tar xzOf "$PREBUILT" ./digest 2>/dev/null)" = "$digest" ] \
     && tar xzf "$PREBUILT" --exclude ./digest && built_with_cuda; then
  echo "build: prebuilt modules of digest $digest ($(( $(date +%s) - t0 )) s)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # no editable install made: the checkout itself
else
  [ -n "${PREBUILT:-}" ] && echo "build: $PREBUILT does not match these sources (digest $digest): building"
  if ! MAX_JOBS=${MAX_JOBS:-$(nproc)} python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
  fi
  echo "build: $(( $(date +%s) - t0 )) s"
  # the modules for a later call, debug information stripped (strip where there is one)
  pack=$(mktemp -d)
  for m in $(modules); do
    mkdir -p "$pack/$(dirname "$m")"
    strip -g -o "$pack/$m" "$m" 2>/dev/null || cp "$m" "$pack/$m"
  done
  echo "$digest" > "$pack/digest"
  tar czf "$OUT/prebuilt.tgz" -C "$pack" . && rm -rf "$pack"
  echo "build: $OUT/prebuilt.tgz ($(du -k "$OUT/prebuilt.tgz" | cut -f1) KiB, digest $digest)"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, torch_direct; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'built_with_cuda', torch_direct.built_with_cuda())" | tee -a "$OUT/gpu.txt"
# the source digest of the tree that runs here, as records name it: `python tools/source_digest.py
# <commit>` where the tree came from says which commit has it (this copy's git metadata may name
# an older one)
python3 tools/source_digest.py | sed 's/^/source /' | tee -a "$OUT/gpu.txt"
[ "${1:-}" = --build-only ] && exit 0
files=("$@"); [ ${#files[@]} -eq 0 ] && files=(tests/test_*.py)
# LANES=k runs k files at a time (each its own pytest process, all on the one GPU), each lane
# taking the next file not yet taken. DEADLINE=s (seconds from here) starts no file after it and
# cuts a running one there, so that a caller's own time limit does not kill files unrecorded:
# a cut file's line says rc=124, a file never started says so.
t_suite=$(date +%s)
printf '%s\n' "${files[@]}" > "$OUT/.queue"; echo 0 > "$OUT/.taken"
rmdir "$OUT/.lock" 2>/dev/null   # a lock left by a run killed while holding it would stall every lane
locked() {  # run "$@" holding the suite's lock (mkdir is atomic: no flock needed)
  until mkdir "$OUT/.lock" 2>/dev/null; do sleep 0.05; done
  "$@"; local rc=$?
  rmdir "$OUT/.lock"; return $rc
}
take() { local n; n=$(cat "$OUT/.taken"); echo $(( n + 1 )) > "$OUT/.taken"; sed -n "$(( n + 1 ))p" "$OUT/.queue"; }
record() {  # name, its summary line, its log
  echo "$2" | tee -a "$OUT/summary.txt"
  # One file of logs, appended as each file ends (the device tool brings back
  # a few files only, and a call cut short still returns what was written).
  [ -f "$3" ] && { echo "===== $1"; grep -v "^Extension modules" "$3"; } >> "$OUT/tests_all.log"
  return 0
}
run_file() {
  local f=$1 name s rc limit=${PER_FILE_TIMEOUT:-300} left
  name=$(basename "$f" .py)
  if [ -n "${DEADLINE:-}" ]; then
    left=$(( t_suite + DEADLINE - $(date +%s) ))
    if [ "$left" -le 0 ]; then locked record "$name" "$name not started: DEADLINE=${DEADLINE}s reached" ""; return; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  s=$(date +%s)
  # PYTEST_ARGS: more pytest options for every file (`-vv --durations=10`: each test by name, and which take the time)
  # in the background and waited for, so that the lane's trap runs while it waits; timeout makes
  # a process group of its own, which the trap stops whole (pytest, and any process it started)
  timeout "$limit" python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_ARGS:-} "$f" > "$OUT/$name.log" 2>&1 &
  running=$!
  wait "$running"; rc=$?; running=
  locked record "$name" "$name rc=$rc $(( $(date +%s) - s ))s :: $(tail -1 "$OUT/$name.log")" "$OUT/$name.log"
  rm -f "$OUT/$name.log"
}
# A caller's own time limit (`timeout 300 bash experiments/device_suite.sh ...`) stops the suite
# with TERM: each lane then stops the file it runs, so that no pytest runs on beside whatever the
# caller starts next (a benchmark's timings, say); its line is not recorded (DEADLINE cuts files
# with their lines).
running=
lane() {
  trap '[ -n "$running" ] && kill -TERM -- -"$running" "$running" 2>/dev/null; exit 143' TERM INT
  local f; while f=$(locked take) && [ -n "$f" ]; do run_file "$f"; done
}
on_signal() {
  trap - TERM INT
  kill -TERM $(jobs -p) 2>/dev/null; wait
  echo "suite stopped by a signal after $(( $(date +%s) - t_suite )) s: the files running then are not recorded" \
    | tee -a "$OUT/summary.txt"
  exit 143
}
trap on_signal TERM INT
for _ in $(seq "${LANES:-1}"); do lane & done
wait
rm -f "$OUT/.queue" "$OUT/.taken"
