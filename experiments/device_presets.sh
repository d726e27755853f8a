#!/usr/bin/env bash
# Run on the GPU machine (device tool): the synthetic presets as peers train
# them, in one call. Builds the extension (device_suite.sh --build-only), then
# for each preset named (default: arxiv products)
#   - generates it, timed, at most GEN_TIMEOUT s (default 900; $OUT/generate_<preset>.log,
#     with the progress of each stage);
#   - `bench train` with PIPELINES (default unified,gpu_resident,cpu_centric)
#     for EPOCHS epochs (default 5), GraphSAGE 3 x 256, fanouts 15,10,5, batch
#     1024, each pipeline REPEATS times taking turns (default 1; rows are the
#     median runs), extra options in TRAIN_ARGS ($OUT/train_<preset>[_TAG].json: epoch
#     times and test accuracy; TAG names runs with other TRAIN_ARGS apart).
# papers100M-like: `papers`; `papers-generate` generates it only.
#   bash experiments/device_presets.sh [arxiv] [products] [papers] [papers-generate]
set -u
OUT="${OUT:-$PWD/device_out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/device_suite.sh" --build-only > "$OUT/presets.log" 2>&1 || { tail -40 "$OUT/presets.log"; exit 1; }
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; fi
export TORCH_DIRECT_DATA="${TORCH_DIRECT_DATA:-/tmp/td_data}"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(arxiv products)
for step in "${steps[@]}"; do
  case "$step" in
    arxiv|products|papers|papers-generate) ;;
    *) echo "device_presets: unknown step $step (arxiv, products, papers, papers-generate)" >&2; exit 2 ;;
  esac
  name="${step%-generate}"; [ "$name" = papers ] && name=papers100M
  preset="$name-like"
  t0=$(date +%s)
  timer=(); [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
  timeout "${GEN_TIMEOUT:-900}" "${timer[@]}" python3 -m torch_direct.gnn.graph "$preset" > "$OUT/generate_$preset.log" 2>&1
  rc=$?
  tr '\r' '\n' < "$OUT/generate_$preset.log" | grep -v "^\s*$" | grep -v "^\s" | tail -4
  echo "$preset: generated rc=$rc in $(( $(date +%s) - t0 )) s, peak RSS $(grep -o 'Maximum resident set size (kbytes): [0-9]*' "$OUT/generate_$preset.log" | grep -o '[0-9]*$') kB" | tee -a "$OUT/presets.log"
  [ "$step" = papers-generate ] || [ "$rc" -ne 0 ] && continue
  run="$preset${TAG:+_$TAG}"
  python3 -m torch_direct.gnn.bench train --dataset "$preset" --pipelines "${PIPELINES:-unified,gpu_resident,cpu_centric}" \
    --epochs "${EPOCHS:-5}" --repeats "${REPEATS:-1}" --no-progress ${TRAIN_ARGS:-} --out "$OUT/train_$run.json" > "$OUT/train_$run.log" 2>&1
  echo "$run: bench train rc=$? (${TRAIN_ARGS:-default options})" | tee -a "$OUT/presets.log"
  tail -25 "$OUT/train_$run.log"
done
