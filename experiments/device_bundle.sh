#!/usr/bin/env bash
# Run last on the GPU machine: pack everything under $OUT into $OUT/bundle.tgz and keep
# only the one-line summaries beside it. The device tool brings back a few files per call
# (eight); a call that writes more (several benchmarks' JSON, logs and plots) loses the
# rest unless they travel as one archive. Unpack here with `tar xzf bundle.tgz -C DIR`.
set -u
OUT="${OUT:-$PWD/device_out}"
[ -d "$OUT" ] || exit 0
rm -rf "$OUT/wheels"
tar czf /tmp/bundle.tgz -C "$OUT" . && mv /tmp/bundle.tgz "$OUT/bundle.tgz" || exit 1
find "$OUT" -mindepth 1 -maxdepth 1 ! -name bundle.tgz ! -name summary.txt ! -name pipeline_summary.txt \
  -exec rm -rf {} +
ls "$OUT"
