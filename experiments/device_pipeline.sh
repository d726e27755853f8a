#!/usr/bin/env bash
# Run on the GPU machine (device tool) after experiments/device_suite.sh has built the
# extension: the end-to-end pipeline figures, in one call.
#
#   bash experiments/device_pipeline.sh [products|products-pyg|products-overlap|products-target|products-cached-gather|papers-cached-gather|papers-driver-pages|papers-reorder|papers-variants|papers-trace|papers-fused-sms|cached-gather-probe|papers-graphed-buffers|papers-step-priority|step-profile|products-ablation|papers|papers-host|scaling|papers-levers|papers-hybrid|papers-data|papers-gpu-resident|papers-all|papers-all-ahead|papers-graphed|papers-graphed-levers|floor-probe|unified-probe|products-cache|papers-cache|profile|gather-probes|gather-kernels|gather-shapes|hugepages|pyg-wheels|all]   (default: all = products)
#
# - pyg-wheels: torch-scatter and torch-sparse (CPU-only: PyG's NeighborLoader
#   samples on the CPU; they go to /tmp/site/pyg, on the path of the benchmark
#   only: PyG would send the min/max scatters of CUDA tensors, as in GAT, to a
#   torch_scatter it can import, and a CPU-only one fails there): the wheels in .whl/ when an earlier run built them
#   (copy them there from its $OUT/wheels), else built from the sdists in
#   .whl/sdist, every extension module compiled at once (`build_ext -j`: pip
#   builds them one after another, which took more than 8 minutes for
#   torch-sparse), each wheel written to $OUT/wheels as soon as it is built.
# - products: `bench train` on products-like (unified, cpu_centric,
#   gpu_resident, and pyg once its wheels are installed), then unified and
#   gpu_resident with `--graph gpu`, then unified with `--graph gpu --sample-ahead` and with
#   `--graph gpu --gather-sms 66` and `33` (products-overlap: these alone, without the
#   four-pipeline run, whose PyG row takes about 6 minutes; products-pyg: the four-pipeline run alone).
# - papers-graphed-buffers: papers100M-like, CSR on the GPU, gpu_resident with the step graphed in
#   PRECISION (default bf16), `--cuda-graph 1` then `--cuda-graph 2` (BUFFER_SETS, default "1 2"):
#   the batch copies on the training stream against beside the other set's replay.
# - papers-step-priority: papers-graphed (AHEAD sampling threads, default 2; GRAPH_BUFFERS default 2;
#   PRECISION default bf16; GRAPHED_PIPELINES default gpu_resident) with the training stream at
#   each priority of STEP_PRIORITIES (default "normal high"; `train --step-priority`).
# - step-profile: papers100M-like, CSR on the GPU, gpu_resident, built-in layers, the step in
#   PRECISION (default bf16) with GRAPH_BUFFERS (default 2) sets of graphed buffers: the floor
#   probe's parts (sample, gather, step alone and together), then `train --profile` of one epoch
#   graphed and one eager (PROFILE_MODES, default "graphed eager", none for neither; the top
#   kernels of 20 steps: what the step's time is made of). The probe's together parts run the step
#   at each of STEP_PRIORITIES (comma-separated, default normal), sampling ahead in AHEAD threads
#   (default 1).
# - products-target: products-like, CSR on the GPU, --reorder frequency, float16 features: the
#   median of three runs of unified (a cache of CACHE_MB MiB, default 384: 82% of the rows),
#   gpu_resident and cpu_centric in one call; then unified and gpu_resident with float16 and with
#   float8 tables at the same FP8_CACHE_MB (default 192: 41% / 79% of the rows); the training
#   stream at STEP_PRIORITY (default normal).
#   FP8_RUNS=0 leaves out the float16 / float8 pair.
# - products-cached-gather, papers-cached-gather: products-target's median-of-three run, and
#   papers100M-like's unified papers-graphed run (bf16, two buffer sets, two sampling threads),
#   each with the cached feature store's gather split, then in one pass (CACHED_GATHER_MODES,
#   default "split fused"; CACHED_GATHER=split|fused sets it for any step); cached-gather-probe: the
#   step-floor probe's parts on products-like with each form (CACHE_MB, default 384).
# - papers-driver-pages: papers-cached-gather's fused run with the table on each of FEATURE_PAGES_LIST
#   (default "small driver": `feature_pages=driver` puts it in memory the CUDA driver allocates and
#   maps at its own granularity, torch_direct.driver_mapped; FEATURE_PAGES=small|huge|driver sets it
#   for any step).
# - papers-reorder: papers-cached-gather's run (CACHED_GATHER, default split) with the nodes in each
#   order of REORDER_LIST (default "none frequency": `--reorder frequency`, hottest rows first, so
#   that a cache's misses fall in the table's cold half; REORDER=degree|frequency sets it for any
#   papers-graphed run; HYBRID_SPLIT=address for any step: the CPU threads take each gather's
#   farthest rows, the GPU the nearer ones; GATHER_WORKERS=N for any papers-graphed unified run:
#   `--gather-workers N`, N gathers in flight, each on its own thread and stream).
# - papers-variants: papers100M-like's unified run (the papers-graphed options: bf16, two buffer
#   sets, two sampling threads, REORDER default frequency, FEATURE_DTYPE, CACHE_MB default 13500,
#   or CACHE_SHARE instead (`--cache-share`: 0.5 holds at most half of the table's bytes on the GPU,
#   scales counted, whatever the feature dtype), 12 CPU threads) once for each variant of VARIANTS ("name=options;name=options", default
#   "workers1=;workers2=--gather-workers 2"), in one process over one relabelled copy
#   (experiments/train_variants.py: the reorder is made once); VARIANT_SETTINGS="name=k=v,k=v;..."
#   runs a variant under experimental settings (e.g. "fused=cached_gather=fused"); VARIANT_SYNC="name=blocking;..."
#   runs a variant with its host waits for the GPU in that mode (train_variants.py --cuda-sync);
#   VARIANT_BATCH_ORDER="name;..." reads those variants' misses in the batch's order, not sorted; OOM_REPORT=1
#   writes what held the GPU memory at a variant's CUDA out-of-memory error (oom_*.json).
# - papers-fused-sms: papers-cached-gather's fused run with `--gather-sms N` for each N of
#   GATHER_SMS_LIST (default "66 33") and gather_kernel=rowblock (one block a row under the cap).
# - products-ablation: `bench train-ablation` on products-like (every lever).
# - papers: papers100M-like generated (timed; unless an earlier step of the machine made it), then
#   `bench train` unified with the CSR in host memory, with `--graph gpu`, and with `--graph gpu
#   --sample-ahead --gather-sms 66`; papers-host: the first of the three alone.
# - scaling: papers100M-like generated (unless it is there), then `bench scaling` on 1, 2, 4 and 8
#   GPUs, as many as the machine has (CSR in host memory), then on 1 and all of them with `--graph gpu`
#   (results/scaling_papers100M-like*.json/.png).
# - profile: `train --profile` on both (the top operators of 20 training steps).
# - papers-levers: papers100M-like, unified with the CSR on the GPU, with the hybrid gather
#   (`--gather-cpu-threads 16`: as many as torch's threads on that machine, so that the CPU share
#   goes to index_select), an 8 GiB cache of the hottest rows, and both (LEVERS_BASELINE=1: the plain
#   `--graph gpu` run first, in the same call; LEVERS_NO_CACHE_ALONE=1: without the cache-only run).
# - papers-hybrid: papers100M-like, CSR on the GPU: gpu_resident (the floor without host reads), then
#   unified with the hybrid gather on 8 and 12 CPU threads (HYBRID_THREADS), then 12 with --sample-ahead.
# - papers-trace: a Chrome trace of 20 training steps (`train --profile`) of papers100M-like's
#   unified run (the papers-variants options, FEATURE_DTYPE, CACHE_MB, and TRACE_OPTIONS, default
#   `--gather-cpu-threads 12`) and of gpu_resident's (FEATURE_DTYPE, no reorder), then
#   experiments/trace_overlap.py on them: each step stream's busy and idle time, what ran beside the
#   step, each kernel's stretch against gpu_resident's.
# - papers-data: papers100M-like generated (up to 400 s: in a call of its own, before the
#   papers-* steps, which otherwise generate it first on a fresh machine).
# - papers-all: papers100M-like, CSR on the GPU, every locality lever at once (`--reorder degree
#   --merge-gathers --cache-mb 8192`: on products-like together 1.31x, on papers100M-like not yet
#   run); papers-all-ahead: the same with --sample-ahead (sampling beside the gather since the
#   gathers let go of the GIL). One call each: reordering copies the 36 GB table.
# - papers-cache: papers100M-like, CSR on the GPU, unified with an 8 GiB cache (ranked by access
#   frequency; runs before this step ranked it by row length), alone and with --reorder frequency
#   --merge-gathers, 12 hybrid threads and --sample-ahead (PAPERS_CACHE_ALONE=0: only the latter).
# - papers-gpu-resident: papers100M-like, CSR on the GPU, gpu_resident alone (the floor of every
#   feature path).
# - products-cache: products-like, CSR on the GPU: gpu_resident, then unified with --reorder frequency
#   --sample-ahead and a GPU cache of the hottest rows of each budget in CACHE_MB_LIST (MiB, default
#   0 128 256 512; the table is 0.98 GB).
# - floor-probe: experiments/step_floor_probe.py on papers100M-like, CSR on the GPU, per precision
#   (PROBE_PRECISIONS, default fp32,tf32,bf16; PROBE_BATCHES per part, default 200; PROBE_LIMIT s; PROBE_LAYERS, PROBE_WAITS,
#   PROBE_PRIORITIES narrow the other three), layer implementation (PyG's, built-in) and the
#   sampler's host waits (experimental sampler_waits default and fewer) and the loader's stream
#   priority (normal, high): the GPU
#   sampler, the gather from GPU memory and the training step, each alone and then together in
#   gpu_resident's loader (with and without --sample-ahead), in ms per batch: what sets the 5.1 s
#   floor of gpu_resident's epoch.
# - gather-kernels: `bench gather` (32 GB, 400K random, 128-1024 B) with each of our read kernels,
#   TORCH_DIRECT_EXPERIMENTAL=gather_kernel=grid (grid-stride, windowed) then =rowblock (one block per row, the
#   default on tables of 8 GiB and more).
# - gather-shapes: experiments/gather_shape_probe.py (CuPy read kernels of other shapes against stock
#   index_select on a sorted index, 32 GB table).
# - papers-graphed: papers100M-like, CSR on the GPU, the step replayed as a CUDA graph
#   (--cuda-graph --layers builtin, AHEAD sampling threads, default 3): gpu_resident, then unified
#   with a cache of CACHE_MB MiB (default 13500: under half of the 28.4 GB table) and GATHER_THREADS
#   hybrid threads (default 12; 0: none; none either with CACHED_GATHER=fused), the model in PRECISION (fp32, tf32 or bf16; default fp32), the table as FEATURE_DTYPE
#   (default stored; fp8: float8 rows, the CPU threads' share copied as bytes and scaled on the
#   GPU; set CACHE_MB to 6990 for half of that table), GRAPH_BUFFERS sets of graphed buffers (1 or 2; default 1),
#   the training stream at STEP_PRIORITY (normal or high; default normal);
#   GRAPHED_PIPELINES picks the runs (default "gpu_resident unified");
#   papers-graphed-levers: that unified run under each experimental setting of LEVERS (default:
#   sampler_relabel=hash, then feature_pages=huge).
# - unified-probe: experiments/step_floor_probe.py on papers100M-like with --store unified (cache
#   CACHE_MB), built-in layers, fp32, each sampler relabel (sort, hash), the table as FEATURE_DTYPE
#   (default stored; fp8: float8 rows, with CACHE_MB for half of that table): the parts of a unified batch.
# - hugepages: experiments/hugepage_gather_probe.py, TABLE_GB (default 32) GB tables: random 256-byte
#   rows from a unified table (4 KiB pages), from one on transparent huge pages, and from memory the
#   CUDA driver allocates and maps itself (CuPy's view, and torch_direct.driver_mapped); PROBE_TABLES
#   (comma-separated) picks tables, SPANS (GB, comma-separated) adds random rows from the unified
#   table's first SPAN GB only.
# - gather-probes: experiments/hybrid_probe.py (the hybrid's CPU share, fixed and chosen, rows of 128-1024 B),
#   then `bench gather` on a 32 GB table, 400K random indices, rows of 128-1024 B.
# Everything is logged under $OUT; each step has its own time limit. A call that runs several
# steps writes more files than the device tool brings back (eight): end it with
# `bash experiments/device_bundle.sh`, which packs them into one archive.
set -u
OUT="${OUT:-$PWD/device_out}"; mkdir -p "$OUT/wheels"
R="$PWD"
what="${1:-all}"
DATA="${TORCH_DIRECT_DATA:-/tmp/td_data}"
export PYTHONUNBUFFERED=1
# Experimental settings for every run of the call, each from a variable of its own, and the tag
# that products-target's and papers-graphed's records then carry in their names:
# CACHED_GATHER=split|fused (the cached feature store's gather: _cached-<mode>), FEATURE_PAGES=
# small|huge|driver (where the unified feature store's table lives: _pages-<mode>), HYBRID_SPLIT=
# index|address (which rows the hybrid gather's CPU threads take: _split-<mode>).
CG=""
experimental_from() {  # setting value tag: TORCH_DIRECT_EXPERIMENTAL gains setting=value, CG _tag-value
  [ -n "$2" ] || return 0
  # once: a nested run of this script (the composite steps call it again) inherits the variable
  local rest
  rest=$(printf '%s' "${TORCH_DIRECT_EXPERIMENTAL:-}" | tr ',' '\n' | grep -v "^$1=" | paste -sd, -)
  export TORCH_DIRECT_EXPERIMENTAL="${rest:+$rest,}$1=$2"
  CG="${CG}_$3-$2"
}
experimental_from cached_gather "${CACHED_GATHER:-}" cached
experimental_from feature_pages "${FEATURE_PAGES:-}" pages
experimental_from hybrid_split "${HYBRID_SPLIT:-}" split

build_pyg_wheels() {
  # Wheels fetched back from an earlier device run and carried in .whl/ are
  # installed as they are; only the missing ones are built.
  for pkg in torch_scatter torch_sparse; do
    if ls "$R"/.whl/"$pkg"-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site/pyg "$R"/.whl/"$pkg"-*.whl
      echo "$pkg: prebuilt wheel from .whl" >> "$OUT/pyg_wheels.log"; continue
    fi
    sd=$(ls "$R"/.whl/sdist/"$pkg"-*.tar.gz 2>/dev/null | head -1)
    [ -n "$sd" ] || { echo "$pkg: no sdist in .whl/sdist" >> "$OUT/pyg_wheels.log"; continue; }
    d=$(mktemp -d) && tar xzf "$sd" -C "$d" && src=$(ls -d "$d"/*/)
    # `build_ext -j` builds the extension modules in parallel, but with ninja
    # they all write one build.ninja in the same temp directory and clobber
    # each other (torch_sparse failed so); without ninja each module compiles
    # its own few files.
    sed -i 's/with_options(no_python_abi_suffix=True)/with_options(no_python_abi_suffix=True, use_ninja=False)/' "$src/setup.py"
    (cd "$src" && FORCE_ONLY_CPU=1 timeout 300 python3 setup.py -q build_ext -j 16 bdist_wheel -d "$OUT/wheels") \
      >> "$OUT/pyg_wheels.log" 2>&1
    echo "$(basename "$sd"): rc=$? $(date +%T)" >> "$OUT/pyg_wheels.log"
    # torch_sparse imports torch_scatter: install each as soon as it exists.
    ls "$OUT"/wheels/"$pkg"-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site/pyg "$OUT"/wheels/"$pkg"-*.whl
  done
}

run_bench() {  # subcommand, name, limit, args...: $OUT/<subcommand>_<name>.json and .log
  local cmd=$1 name=$2 limit=$3; shift 3
  local t0; t0=$(date +%s)
  PYTHONPATH=/tmp/site/pyg:/tmp/site${PYTHONPATH:+:$PYTHONPATH} timeout "$limit" python3 -m torch_direct.gnn.bench "$cmd" \
    --root "$DATA" --no-progress --out "$OUT/${cmd}_$name.json" "$@" > "$OUT/${cmd}_$name.log" 2>&1
  echo "$cmd $name: rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pipeline_summary.txt"
  tail -12 "$OUT/${cmd}_$name.log"
}
bench() { run_bench train "$@"; }  # name, limit, args...

papers_data() {
  local t0; t0=$(date +%s)
  timeout 400 python3 -m torch_direct.gnn.graph papers100M-like --root "$DATA" --quiet > "$OUT/papers_gen.log" 2>&1
  echo "papers100M-like generation: rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pipeline_summary.txt"
}

papers_data_once() {  # generated once a machine
  [ -f "$DATA/papers100M-like-seed0/meta.json" ] || papers_data
}

papers_variants() {  # papers-variants (VARIANTS, VARIANT_SETTINGS; the header says)
  papers_data_once
  local args=() v t0 name cache=()
  each() {  # each non-empty ";"-separated item of $2, passed as option $1
    IFS=';' read -ra vs <<< "$2"
    for v in "${vs[@]}"; do [ -n "$v" ] && args+=("$1" "$v"); done
  }
  each --variant "${VARIANTS:-workers1=;workers2=--gather-workers 2}"
  each --experimental "${VARIANT_SETTINGS:-}"
  each --cuda-sync "${VARIANT_SYNC:-}"
  each --misses-in-batch-order "${VARIANT_BATCH_ORDER:-}"
  [ "${OOM_REPORT:-0}" = 1 ] && args+=(--oom-report)
  name=papers100M-like_variants_${FEATURE_DTYPE:-stored}_reorder-${REORDER:-frequency}
  cache=(--cache-mb "${CACHE_MB:-13500}")
  [ -n "${CACHE_SHARE:-}" ] && cache=(--cache-share "$CACHE_SHARE")
  t0=$(date +%s)
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} timeout "${RUN_LIMIT:-560}" python3 experiments/train_variants.py \
    --out-dir "$OUT" --name "$name" "${args[@]}" -- --root "$DATA" --no-progress --dataset papers100M-like \
    --epochs 2 --graph gpu --cuda-graph 2 --sample-ahead 2 --layers builtin --test-nodes 100000 --precision bf16 \
    --reorder "${REORDER:-frequency}" --pipelines unified --feature-dtype "${FEATURE_DTYPE:-stored}" \
    "${cache[@]}" --gather-cpu-threads "${GATHER_THREADS:-12}" > "$OUT/train_$name.log" 2>&1
  echo "train_variants $name: rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pipeline_summary.txt"
  # each variant's row and its host side: the step, the CPU, the loop's GIL wait, the gathers' parts, the captured step's parts
  grep -E "^variant |^\| (unified|gpu_resident) |: train step |run dry|: process CPU |s in all|to get the GIL back|gathers' parts|captured step:|host side a replay|copies into the captured" \
    "$OUT/train_$name.log"
}

papers_graphed() {  # papers-graphed (its options in the environment, as the header says)
  papers_data_once
  local common fd tag threads p
  common="--dataset papers100M-like --epochs 2 --graph gpu --cuda-graph ${GRAPH_BUFFERS:-1} --sample-ahead ${AHEAD:-3} --layers builtin --test-nodes 100000 --precision ${PRECISION:-fp32} --step-priority ${STEP_PRIORITY:-normal} --reorder ${REORDER:-none}"
  fd=${FEATURE_DTYPE:-stored}; tag=${PRECISION:-fp32}${FEATURE_DTYPE:+_$FEATURE_DTYPE}${GRAPH_BUFFERS:+_buffers$GRAPH_BUFFERS}${AHEAD:+_ahead$AHEAD}${STEP_PRIORITY:+_step-$STEP_PRIORITY}$CG${GATHER_SMS:+_gather-sms$GATHER_SMS}${REORDER:+_reorder-$REORDER}${CACHE_MB:+_cache$CACHE_MB}${GATHER_THREADS:+_threads$GATHER_THREADS}${GATHER_WORKERS:+_workers$GATHER_WORKERS}
  # the hybrid gather's CPU threads (GATHER_THREADS, default 12; none with the one-pass cached
  # gather, which reads every miss on the GPU)
  threads="--gather-cpu-threads ${GATHER_THREADS:-12}"
  { [ "${GATHER_THREADS:-12}" = 0 ] || [ "${CACHED_GATHER:-}" = fused ]; } && threads=""
  # a reordered run first relabels the 3.2 billion CSR entries and copies the table (minutes)
  local limit=200; [ "${REORDER:-none}" != none ] && limit=420
  limit=${RUN_LIMIT:-$limit}   # RUN_LIMIT: seconds for the unified run (gpu_resident's: 50 fewer)
  for p in ${GRAPHED_PIPELINES:-gpu_resident unified}; do
    case "$p" in
      gpu_resident) bench "papers100M-like_graphed_gpu-resident_$tag" $(( limit - 50 )) $common --pipelines gpu_resident --feature-dtype "$fd" ;;
      unified) bench "papers100M-like_graphed_unified_$tag" "$limit" $common --pipelines unified --feature-dtype "$fd" \
        --cache-mb "${CACHE_MB:-13500}" $threads ${GATHER_SMS:+--gather-sms $GATHER_SMS} \
        ${GATHER_WORKERS:+--gather-workers $GATHER_WORKERS} ;;
      *) echo "papers-graphed: unknown pipeline $p in GRAPHED_PIPELINES (gpu_resident, unified)" >&2 ;;
    esac
  done
}

# unified on products-like with the GPU sampler on a GPU copy of the CSR, and the loader's ways
# of overlapping its work with the training step (docs/pipeline-measurements.md)
products_overlap() {
  # with full-neighbourhood test accuracy beside the sampled one (the sampled-inference target)
  bench products-like_graph-gpu 150 --dataset products-like --epochs 2 --pipelines unified,gpu_resident --graph gpu \
    --test-nodes 100000 --full-eval
  # sampling in its own thread and stream: with the CSR in host memory its reads compete with
  # the gather's for PCIe (1.92 s against 1.81 without); with a GPU copy they do not
  bench products-like_graph-gpu_sample-ahead 60 --dataset products-like --epochs 2 --pipelines unified \
    --graph gpu --sample-ahead --test-nodes 100000
  # the gather kernel on half or a quarter of the 132 SMs: the training step's kernels get the rest
  for sms in 66 33; do
    bench products-like_graph-gpu_gather-sms$sms 60 --dataset products-like --epochs 2 --pipelines unified \
      --graph gpu --gather-sms $sms --test-nodes 100000
  done
  bench products-like_graph-gpu_sample-ahead_gather-sms66 60 --dataset products-like --epochs 2 \
    --pipelines unified --graph gpu --sample-ahead --gather-sms 66 --test-nodes 100000
}

# bench scaling on papers100M-like: the 1-GPU baseline in the same run as every larger count
scaling() {
  papers_data_once
  local n counts=1; n=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  for k in 2 4 8; do [ "$k" -le "$n" ] && counts="$counts,$k"; done
  run_bench scaling papers100M-like 330 --dataset papers100M-like --epochs 2 --nproc "$counts" \
    --test-nodes 100000 --timeout 150 --plot "$OUT/scaling_papers100M-like.png"
  [ "$n" -gt 1 ] && run_bench scaling papers100M-like_graph-gpu 200 --dataset papers100M-like --epochs 2 \
    --nproc "1,$n" --graph gpu --test-nodes 100000 --timeout 120 --plot "$OUT/scaling_papers100M-like_graph-gpu.png"
}

case "$what" in
  pyg-wheels) build_pyg_wheels ;;
  products|products-pyg|all)  # every pipeline (PyG's wheels first: a compile beside the benchmark would take
    # the CPU its pipelines use)
    build_pyg_wheels
    # products-like's test split is 2.2M nodes: PyG's loader alone would take minutes to infer them
    # all, so every pipeline reports test accuracy over the same fixed 100K of them.
    bench products-like 560 --dataset products-like --epochs 2 --pipelines unified,cpu_centric,gpu_resident,pyg \
      --pyg-workers 16 --test-nodes 100000
    [ "$what" = products-pyg ] || products_overlap ;;
  products-overlap) products_overlap ;;
  gather-probes)  # the gather's open questions (docs/gather.md): the hybrid's split, then the
    # hybrid target's points (32 GB table, 400K random indices) of bench gather
    (cd experiments && PROBE_ROWS=128,256,512,1024 timeout 200 python3 hybrid_probe.py "$OUT/hybrid_probe.json") 2>&1 \
      | tee "$OUT/gather_probes.log"
    timeout 240 python3 -m torch_direct.gnn.bench gather --table-gb 32 --row-bytes 128,256,512,1024 --indices 400000 \
      --orders random --dtypes fp32 --out "$OUT/gather_32gb.json" 2>&1 | tee -a "$OUT/gather_probes.log" | tail -25 ;;
  gather-kernels)  # our read kernel's two launch geometries, same table, one process each (docs/gather.md)
    for k in grid rowblock; do
      TORCH_DIRECT_EXPERIMENTAL=gather_kernel=$k timeout 150 python3 -m torch_direct.gnn.bench gather --table-gb 32 \
        --row-bytes 128,256,512,1024 --indices 400000 --orders random --dtypes fp32 --methods naive_uva_sorted,memcpy \
        --out "$OUT/gather_32gb_kernel-$k.json" 2>&1 | tee -a "$OUT/gather_kernels.log" | grep -E 'vs naive_uva_sorted|target'
    done ;;
  gather-shapes)  # which shape of read kernel reaches stock index_select's rate (docs/gather.md)
    (cd experiments && timeout 240 python3 gather_shape_probe.py "$OUT/gather_shape_probe.json") 2>&1 | tee "$OUT/gather_shapes.log" ;;
  papers-levers)  # the levers on the gather's PCIe time, papers100M-like, CSR on the GPU (the <= 4 s target)
    papers_data_once
    [ -n "${LEVERS_BASELINE:-}" ] && bench papers100M-like_graph-gpu 170 --dataset papers100M-like --epochs 2 \
      --pipelines unified --graph gpu --test-nodes 100000
    bench papers100M-like_graph-gpu_hybrid 170 --dataset papers100M-like --epochs 2 --pipelines unified \
      --graph gpu --gather-cpu-threads 16 --test-nodes 100000
    [ -z "${LEVERS_NO_CACHE_ALONE:-}" ] && bench papers100M-like_graph-gpu_cache8g 170 --dataset papers100M-like \
      --epochs 2 --pipelines unified --graph gpu --cache-mb 8192 --test-nodes 100000
    bench papers100M-like_graph-gpu_cache8g_hybrid 170 --dataset papers100M-like --epochs 2 --pipelines unified \
      --graph gpu --cache-mb 8192 --gather-cpu-threads 16 --test-nodes 100000 ;;
  papers-hybrid)  # the hybrid gather with fewer CPU threads than cores (the training loop keeps
    # some), alone and with sampling in its own thread and stream (docs/pipeline-measurements.md)
    papers_data_once
    # the floor without host reads: the features (36 GB) fit the H200
    bench papers100M-like_graph-gpu_gpu-resident 150 --dataset papers100M-like --epochs 2 \
      --pipelines gpu_resident --graph gpu --test-nodes 100000
    for t in ${HYBRID_THREADS:-8 12}; do
      bench papers100M-like_graph-gpu_hybrid$t 150 --dataset papers100M-like --epochs 2 --pipelines unified \
        --graph gpu --gather-cpu-threads "$t" --test-nodes 100000
    done
    bench papers100M-like_graph-gpu_hybrid12_sample-ahead 150 --dataset papers100M-like --epochs 2 \
      --pipelines unified --graph gpu --gather-cpu-threads 12 --sample-ahead --test-nodes 100000 ;;
  products-cache)  # unified's epoch against the GPU cache's budget, with the levers that helped
    # (reorder by degree, sampling ahead; merged gathers cost time once the cache serves most rows),
    # beside gpu_resident in the same call (the 1.15x target on products-like; docs/pipeline-measurements.md)
    bench products-like_graph-gpu_gpu-resident 60 --dataset products-like --epochs 2 --pipelines gpu_resident \
      --graph gpu --test-nodes 20000
    for mb in ${CACHE_MB_LIST:-0 128 256 512}; do
      bench products-like_graph-gpu_reorder_sample-ahead_cache$mb 60 --dataset products-like --epochs 2 \
        --pipelines unified --graph gpu --reorder frequency --sample-ahead --cache-mb "$mb" --test-nodes 20000
    done ;;
  papers-cache)  # the 8 GiB cache ranked by access frequency (earlier runs ranked it by row length: 30%
    # of lookups hit, its share of the rows), alone and with every lever, the hybrid and sampling ahead
    papers_data_once
    [ "${PAPERS_CACHE_ALONE:-1}" = 1 ] && bench papers100M-like_graph-gpu_cache8g 170 --dataset papers100M-like \
      --epochs 2 --pipelines unified --graph gpu --cache-mb 8192 --test-nodes 100000
    bench papers100M-like_graph-gpu_all-levers-freq_hybrid12_sample-ahead 200 --dataset papers100M-like \
      --epochs 2 --pipelines unified --graph gpu --reorder frequency --merge-gathers --cache-mb 8192 \
      --gather-cpu-threads 12 --sample-ahead --test-nodes 100000 ;;
  papers-data) papers_data_once ;;
  papers-gpu-resident)  # the floor without host reads (the features fit the H200)
    papers_data_once
    bench papers100M-like_graph-gpu_gpu-resident 150 --dataset papers100M-like --epochs 2 \
      --pipelines gpu_resident --graph gpu --test-nodes 100000 ;;
  floor-probe)  # what sets gpu_resident's epoch on papers100M-like: sampler, gather and step alone and
    # together, per precision (experiments/step_floor_probe.py; docs/pipeline-measurements.md)
    # (one process: the data set is loaded to the GPU once for every precision)
    papers_data_once
    timeout "${PROBE_LIMIT:-300}" python3 experiments/step_floor_probe.py --root "$DATA" --dataset papers100M-like --graph gpu \
      --batches "${PROBE_BATCHES:-200}" --precision "${PROBE_PRECISIONS:-fp32,tf32,bf16}" --layers "${PROBE_LAYERS:-pyg,builtin}" \
      --sampler-waits "${PROBE_WAITS:-default,fewer}" --loader-priority "${PROBE_PRIORITIES:-normal,high}" \
      --no-progress \
      --out "$OUT/floor_probe_papers100M-like.json" \
      > "$OUT/floor_probe.log" 2>&1
    echo "floor-probe: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; tail -50 "$OUT/floor_probe.log" ;;
  papers-all)  # every locality lever on papers100M-like (the <= 4 s target)
    papers_data_once
    bench papers100M-like_graph-gpu_all-levers 400 --dataset papers100M-like --epochs 2 --pipelines unified \
      --graph gpu --reorder degree --merge-gathers --cache-mb 8192 --test-nodes 100000 ;;
  papers-all-ahead)  # the same with sampling ahead, on its own stream
    papers_data_once
    bench papers100M-like_graph-gpu_all-levers_sample-ahead 400 --dataset papers100M-like --epochs 2 \
      --pipelines unified --graph gpu --reorder degree --merge-gathers --cache-mb 8192 --sample-ahead \
      --test-nodes 100000 ;;
  papers-graphed)  # the graphed step with its padding spread over rows (docs/pipeline-measurements.md)
    papers_graphed ;;
  papers-graphed-buffers)  # gpu_resident with one set of graphed buffers, then two (the copies beside the replay)
    for n in ${BUFFER_SETS:-1 2}; do
      GRAPH_BUFFERS=$n GRAPHED_PIPELINES=${GRAPHED_PIPELINES:-gpu_resident} PRECISION=${PRECISION:-bf16} papers_graphed
    done ;;
  papers-step-priority)  # the training stream at normal then high priority (STEP_PRIORITIES), papers-graphed's runs
    for prio in ${STEP_PRIORITIES:-normal high}; do
      STEP_PRIORITY=$prio AHEAD=${AHEAD:-2} GRAPH_BUFFERS=${GRAPH_BUFFERS:-2} PRECISION=${PRECISION:-bf16} \
        GRAPHED_PIPELINES=${GRAPHED_PIPELINES:-gpu_resident} papers_graphed
    done ;;
  products-target)  # the products-like target: median of three runs of each pipeline in one call, float16
    # features and a cache below the whole table, then float16 against float8 at the same cache bytes
    pc="--dataset products-like --epochs 2 --graph gpu --reorder frequency --test-nodes 100000 --step-priority ${STEP_PRIORITY:-normal}"
    bench products-like_median3_fp16_cache${CACHE_MB:-384}${STEP_PRIORITY:+_step-$STEP_PRIORITY}$CG 420 $pc --pipelines unified,gpu_resident,cpu_centric \
      --repeats 3 --feature-dtype fp16 --cache-mb "${CACHE_MB:-384}"
    [ "${FP8_RUNS:-1}" = 1 ] && for fd in fp16 fp8; do
      bench products-like_cache${FP8_CACHE_MB:-192}_$fd${STEP_PRIORITY:+_step-$STEP_PRIORITY}$CG 150 $pc --pipelines unified,gpu_resident \
        --feature-dtype $fd --cache-mb "${FP8_CACHE_MB:-192}"
    done ;;
  products-cached-gather)  # products-target's median-of-three run with the cached gather split, then fused
    for m in ${CACHED_GATHER_MODES:-split fused}; do CACHED_GATHER=$m FP8_RUNS=0 bash "$0" products-target; done ;;
  cached-gather-probe)  # the probe's parts (sample, gather, step alone and together) on products-like, unified
    # with a 384 MiB cache, float16 features, the eager step (train's default layers): the cache's gather split, then fused
    timeout "${PROBE_LIMIT:-240}" python3 experiments/step_floor_probe.py --root "$DATA" --dataset products-like \
      --graph gpu --store unified --cache-mb "${CACHE_MB:-384}" --feature-dtype fp16 \
      --cached-gather split,fused --batches "${PROBE_BATCHES:-150}" --no-progress \
      --out "$OUT/floor_probe_products-like_cached-gather.json" > "$OUT/floor_probe_cached_gather.log" 2>&1
    echo "cached-gather probe: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; tail -22 "$OUT/floor_probe_cached_gather.log" ;;
  papers-cached-gather)  # papers100M-like's unified run (papers-graphed's, bf16, two buffer sets, two sampling
    # threads) with the cached gather split (and 12 CPU threads taking a share of the misses), then fused
    # (every miss read by the GPU)
    for m in ${CACHED_GATHER_MODES:-split fused}; do
      CACHED_GATHER=$m GRAPHED_PIPELINES=unified PRECISION=${PRECISION:-bf16} GRAPH_BUFFERS=${GRAPH_BUFFERS:-2} \
        AHEAD=${AHEAD:-2} bash "$0" papers-graphed
    done ;;
  papers-driver-pages)  # papers-cached-gather's fused run with the table on each of FEATURE_PAGES_LIST
    # (default "small driver": the allocator's 4 KiB pages, then memory the CUDA driver allocates and
    # maps at its own granularity, torch_direct.driver_mapped), so that the misses' random reads need
    # fewer address translations
    for pages in ${FEATURE_PAGES_LIST:-small driver}; do
      FEATURE_PAGES=$pages CACHED_GATHER=fused GRAPHED_PIPELINES=unified PRECISION=${PRECISION:-bf16} \
        GRAPH_BUFFERS=${GRAPH_BUFFERS:-2} AHEAD=${AHEAD:-2} bash "$0" papers-graphed
    done ;;
  papers-reorder)  # papers-cached-gather's unified run (CACHED_GATHER, default split: 12 CPU threads take
    # a share of the misses) with the nodes in each order of REORDER_LIST (default "none frequency"):
    # hottest rows first, the cache's misses fall in the table's cold half, a narrower span of
    # addresses, which the GPU reads faster (hugepages with SPANS)
    for order in ${REORDER_LIST:-none frequency}; do
      REORDER=$order CACHED_GATHER=${CACHED_GATHER:-split} GRAPHED_PIPELINES=unified PRECISION=${PRECISION:-bf16} \
        GRAPH_BUFFERS=${GRAPH_BUFFERS:-2} AHEAD=${AHEAD:-2} bash "$0" papers-graphed
    done ;;
  papers-variants) papers_variants ;;
  papers-trace)  # where the unified step's GPU time goes (the header says)
    papers_data_once
    common="--root $DATA --dataset papers100M-like --epochs 1 --graph gpu --cuda-graph 2 --sample-ahead 2 --layers builtin
      --precision bf16 --test-nodes 1000 --no-progress --feature-dtype ${FEATURE_DTYPE:-stored}"
    # shellcheck disable=SC2086  # word splitting of the option lists is meant
    timeout "${RUN_LIMIT:-200}" python3 -m torch_direct train $common --pipeline unified --reorder "${REORDER:-frequency}" \
      --cache-mb "${CACHE_MB:-13500}" ${TRACE_OPTIONS:---gather-cpu-threads 12} --profile "$OUT/trace_unified.json" \
      > "$OUT/trace_unified.log" 2>&1
    echo "papers-trace unified: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; grep -E "^epoch|wrote" "$OUT/trace_unified.log"
    # shellcheck disable=SC2086
    timeout 150 python3 -m torch_direct train $common --pipeline gpu_resident --profile "$OUT/trace_gpu_resident.json" \
      > "$OUT/trace_gpu_resident.log" 2>&1
    echo "papers-trace gpu_resident: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; grep -E "^epoch|wrote" "$OUT/trace_gpu_resident.log"
    python3 experiments/trace_overlap.py "$OUT/trace_unified.json" --compare "$OUT/trace_gpu_resident.json" \
      --json "$OUT/trace_overlap_papers100M-like_unified.json" | tee "$OUT/trace_overlap_unified.txt"
    python3 experiments/trace_overlap.py "$OUT/trace_gpu_resident.json" --top 6 \
      --json "$OUT/trace_overlap_papers100M-like_gpu_resident.json" | tee "$OUT/trace_overlap_gpu_resident.txt"
    gzip -f "$OUT"/trace_unified.json "$OUT"/trace_gpu_resident.json ;;
  papers-fused-sms)  # papers-cached-gather's fused run with the gather capped to each of GATHER_SMS_LIST
    # SMs (default "66 33"), one block a row under the cap (gather_kernel=rowblock), so that the
    # sampling threads' and the step's kernels keep the other SMs
    for sms in ${GATHER_SMS_LIST:-66 33}; do
      TORCH_DIRECT_EXPERIMENTAL="${TORCH_DIRECT_EXPERIMENTAL:+$TORCH_DIRECT_EXPERIMENTAL,}gather_kernel=rowblock" \
        CACHED_GATHER=fused GATHER_SMS=$sms GRAPHED_PIPELINES=unified PRECISION=${PRECISION:-bf16} \
        GRAPH_BUFFERS=${GRAPH_BUFFERS:-2} AHEAD=${AHEAD:-2} bash "$0" papers-graphed
    done ;;
  step-profile)  # what the graphed step of papers100M-like is made of
    papers_data_once
    timeout "${PROBE_LIMIT:-240}" python3 experiments/step_floor_probe.py --root "$DATA" --dataset papers100M-like --graph gpu \
      --store gpu_resident --layers builtin --precision "${PRECISION:-bf16}" --cuda-graph "${GRAPH_BUFFERS:-2}" \
      --step-priority "${STEP_PRIORITIES:-normal}" --sample-ahead "${AHEAD:-1}" \
      --batches "${PROBE_BATCHES:-200}" --no-progress --out "$OUT/floor_probe_papers100M-like_step.json" \
      > "$OUT/floor_probe_step.log" 2>&1
    echo "step-profile probe: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; tail -15 "$OUT/floor_probe_step.log"
    for mode in ${PROFILE_MODES:-graphed eager}; do
      [ "$mode" = none ] && continue
      graph=""; [ "$mode" = graphed ] && graph="--cuda-graph ${GRAPH_BUFFERS:-2}"
      timeout 150 python3 -m torch_direct train --root "$DATA" --dataset papers100M-like --pipeline gpu_resident \
        --epochs 1 --graph gpu --layers builtin --precision "${PRECISION:-bf16}" --sample-ahead 3 $graph \
        --test-nodes 1000 --no-progress --profile "$OUT/profile_step_$mode.txt" > "$OUT/profile_step_$mode.log" 2>&1
      echo "step-profile $mode: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; head -45 "$OUT/profile_step_$mode.txt" | cut -c1-220
    done ;;
  papers-graphed-levers)  # the same unified run with each experimental lever (docs/pipeline-measurements.md, docs/gather.md)
    papers_data_once
    common="--dataset papers100M-like --epochs 2 --graph gpu --cuda-graph --sample-ahead ${AHEAD:-3} --layers builtin --test-nodes 100000 --precision ${PRECISION:-fp32}"
    for lever in ${LEVERS:-sampler_relabel=hash feature_pages=huge}; do
      TORCH_DIRECT_EXPERIMENTAL=$lever bench "papers100M-like_graphed_unified_${lever//=/-}" 200 $common \
        --pipelines unified --cache-mb "${CACHE_MB:-13500}" --gather-cpu-threads 12
    done ;;
  unified-probe)  # the parts of a unified batch, with each sampler relabel (docs/pipeline-measurements.md)
    papers_data_once
    timeout "${PROBE_LIMIT:-300}" python3 experiments/step_floor_probe.py --root "$DATA" --dataset papers100M-like \
      --graph gpu --store unified --cache-mb "${CACHE_MB:-13500}" --layers builtin --precision fp32 \
      --batches "${PROBE_BATCHES:-100}" --sampler-relabel sort,hash --feature-dtype "${FEATURE_DTYPE:-stored}" --no-progress \
      --profile-sample "$OUT/sample_profile.txt" --out "$OUT/unified_probe_papers100M-like.json" > "$OUT/unified_probe.log" 2>&1
    echo "unified-probe: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; grep -v Warn "$OUT/unified_probe.log" | tail -24 ;;
  hugepages)  # random rows from 4 KiB against 2 MiB pages (docs/gather.md)
    timeout "${PROBE_LIMIT:-360}" python3 experiments/hugepage_gather_probe.py --table-gb "${TABLE_GB:-32}" \
      ${PROBE_TABLES:+--tables $PROBE_TABLES} ${SPANS:+--spans $SPANS} \
      --out "$OUT/hugepage_gather_probe.json" > "$OUT/hugepages.log" 2>&1
    echo "hugepages: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; tail -6 "$OUT/hugepages.log" ;;
  scaling) scaling ;;
  profile)  # what a training step spends its time on (products-like and papers100M-like, unified)
    for ds in products-like papers100M-like; do
      timeout 150 python3 -m torch_direct train --root "$DATA" --dataset "$ds" --epochs 1 --no-progress \
        --test-nodes 1000 --profile "$OUT/profile_$ds.txt" > "$OUT/profile_$ds.log" 2>&1
      echo "profile $ds: rc=$?" | tee -a "$OUT/pipeline_summary.txt"; head -30 "$OUT/profile_$ds.txt"
    done ;;
  products-ablation)
    run_bench train-ablation products-like 300 --dataset products-like --epochs 2 --cache-mb 256 ;;
  papers|papers-host)  # papers-host: the first run alone (the README's CSR-in-host-memory row)
    papers_data_once
    # test accuracy over a fixed 100K of the test split, as on products-like
    bench papers100M-like 170 --dataset papers100M-like --epochs 2 --pipelines unified --test-nodes 100000
    [ "$what" = papers-host ] && exit 0
    bench papers100M-like_graph-gpu 170 --dataset papers100M-like --epochs 2 --pipelines unified --graph gpu \
      --test-nodes 100000
    [ -n "${SKIP_SAMPLE_AHEAD:-}" ] || bench papers100M-like_graph-gpu_sample-ahead 150 --dataset papers100M-like \
      --epochs 2 --pipelines unified --graph gpu --sample-ahead --gather-sms 66 --test-nodes 100000 ;;
  *) echo "device_pipeline: unknown step $what; the steps: $(sed -n 's/^#   bash experiments\/device_pipeline.sh \[\(.*\)\].*/\1/p' "$0" | tr '|' ' ')" >&2
     exit 2 ;;
esac
