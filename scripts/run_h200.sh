#!/usr/bin/env bash
# The H200 runs of issue #4, one step per argument, logs and JSON under $OUT (the device tool's
# output folder; ./out elsewhere). A failing step is reported and the next one still runs.
#
#   scripts/run_h200.sh check w2-qwen w1 profile        # kernels + W5, W2 Qwen3 (lamina), W1 (lamina)
#   scripts/run_h200.sh w1-peer w2-qwen-peer w2-llama-peer   # each lamina run with HF in the same process
#
# Steps:  check          scripts/gpu_check.py --quick (kernel + op checks at real shapes, W5)
#         gemv           lamina.bench.gemv_sweep (decode GEMV vs cuBLAS, all W2 shapes)
#         w1 | w1-peer   lamina.bench.offline --workload w1 [--peer hf]
#         w2-qwen | w2-qwen-peer | w2-llama | w2-llama-peer   lamina.bench.offline --workload w2 ...
#         profile        scripts/profile_decode.py (W2 Qwen3 decode step: GPU kernels vs host)
#         sampling       lamina.bench.sampling (sampling kernel vs torch path, chi-square at V = 151,936)
#         w1-sweep       lamina.bench.w1_sweep (defaults vs a max_num_seqs x budget grid; greedy, top-p)
#         w4-sweep       lamina.bench.w4_sweep (lamina serve per scheduler setting, bench serve at 8, 32, inf req/s)
#         startup        lamina.bench.startup, cold (empty Triton cache) then warm, Qwen3-0.6B and Llama-3-8B
#         quant-speed    lamina.bench.quant_speed (W4A16 / W8A16 kernels and 8B-shape decode vs bf16, issue #13)
#         quant-speed-quick   the same, the int4 GEMV default config only, GEMMs timed for the first 60 s
#         spec-ngram     lamina.bench.spec, n-gram adaptive vs k fixed vs off (issue #12)
#         spec           lamina.bench.spec, every method (issue #12)
#         quant-w8a8     scripts/quant_w8a8_gpu_check.py (int8 / fp8 GEMMs, W8A8 layers and demo models vs reference)
#         w8a8-speed     lamina.bench.w8a8_speed (8B shape: fp8 / int8 W8A8 vs bf16, 4k-token prefill and W1)
#         spec-eagle     lamina.bench.spec, eagle / draft_model / n-gram, batch 1 sets + batch 1, 8, 128
#         spec-check     scripts/spec_gpu_check.py (rejection sampler on CUDA, greedy identity of every method)
#         spec-graphs    lamina.bench.spec: n-gram (default k = 7 and k = 3, adaptive and fixed), EAGLE and the draft
#                        model (drafting in CUDA graphs), batch 1 sets + batch 1, 8, 128
#         spec-projection  lamina.bench.spec_projection --k 7 (Llama-3-8B shape: verify of 8 tokens vs decode)
#         spec-batch     lamina.bench.spec: n-gram (default, k fixed) vs off at batch 1, 8, 32, 128, 256 only
#         spec-final     lamina.bench.spec: n-gram (default, k fixed) vs off, batch 1 sets + batch 1, 8, 32, 128, 256
#         quant-engine   lamina.bench.quant_speed --skip-kernels (8B-shape decode, batch 1 and 8: bf16, int4, int8)
#         mma-sweep      scripts/wna16_mma_sweep.py (tensor-core W4A16 / W8A16 vs GEMV, dequantize + cuBLAS, bf16)
#         spec-decision  lamina.bench.spec_decision (host time of one n-gram decision at 1 .. 256 requests)
#         spec-gate      lamina.bench.spec: n-gram (default, k fixed) vs off, batch 1 sets, batch 1 .. 256 and the
#                        closed loop at concurrency 8 .. 256 (the gate's rows, issue #12)
#         spec-gate-models  the same rows for the draft model and EAGLE (no prompt sets)
#         spec-gate-trace   scripts/trace_spec_gate.py (the gate's windows in the closed loop at 8 .. 256)
#         spec-gate-batch   the gate's throughput and closed-loop rows only, 5 repeats
#         kv-fp8         scripts/fp8_kv_gpu_check.py and fp8_kv_decode_sweep.py, then W1 with kv_cache_dtype auto and fp8 (issue #13's stretch)
#         eagle-train    the demo EAGLE head trained on the H200 (scripts/demo_model/eagle_device.sh) into
#                        $OUT/demo-eagle-gpu.tgz, with the shipped head evaluated on the same held-out data
#         quant-w8a8     (above); mem-check  scripts/engine_memory_check.py (is a dropped engine's memory given back?)
#         fp8-static     scripts/fp8_static_gpu_check.py --check h200_payload/fp8 (prepared on a CPU with --prepare)
#         profile-quant  scripts/profile_decode.py, Llama-3-8B shape, batch-1 decode kernels: bf16, int8, int4
#         spec-batch-trace  scripts/trace_spec_batch.py (fixed batches of 8 and 32: steps by rows and kind, on and off)
#         quant-w8a8-layers  scripts/quant_w8a8_gpu_check.py --skip-models (GEMMs and layers only)
#         fp8-stack      the kv-fp8 check and sweep, the 8B W1 profile (fp8 + fp8 KV), lamina.bench.w8a8_speed
#                        (bf16, fp8, fp8 + fp8 KV)
#         kv-fp8-sweep   scripts/fp8_kv_decode_sweep.py alone (the fp8 decode kernel's configs against bf16)
#         profile-w1     scripts/profile_decode.py, Llama-3-8B shape, 128 requests at ~1,000 tokens: bf16, fp8, fp8 + fp8 KV
#         spec-tree      scripts/spec_draft_sampling_check.py (tree drafts through the graphs against off), the
#                        draft model's and EAGLE's verify steps, k = 3 chains against BENCH_TREE's trees
#                        (profile_spec.py, no profiler), then lamina.bench.spec on them, batch 1
#         spec-profile-128  scripts/profile_spec.py --batch-size 128 --methods ngram (cProfile: where a step's host
#                        time goes at 128 rows, with and without speculation)
#         spec-tree-f32  scripts/spec_draft_sampling_check.py on the tree engines in float32 (bf16 rounding or a fault?)
#         spec-big       lamina.bench.spec: n-gram and the draft model (adaptive) against off at 128 and 256 rows,
#                        512 tokens a request (the never-slower bar in a steady state)
#         spec-big-stalls  the same rows, 5 repeats, each with its stalls and garbage collections (lamina/bench/stalls.py)
#         spec-big-6     the same rows, 6 repeats: each engine runs first in two of them (the bench's turns)
#         spec-big-control  the same rows, 8 repeats, with a second engine without speculation built last
#                        (lamina.bench.spec's control: the noise floor of the paired ratios)
#         spec-big-precise  8, 32, 128 and 256 rows with the control, 256 tokens, 24 repeats
#         spec-b1        lamina.bench.spec, batch 1 on the prompt sets only: n-gram (default), the draft model (default
#                        and k = 3 fixed), 256 tokens, 3 repeats (the batch-1 bar)
#         spec-b1-control  batch 1 on the prompt sets: control, n-gram and the draft model (defaults), 8 repeats
#         spec-b1-plain  scripts/profile_spec.py on the default draft model and n-gram at batch 1: step times by kind
#         spec-host      scripts/profile_spec.py on the draft model's k = 3 chain at batch 1: step times, cProfile by own
#                        and by cumulative time, the device's timeline (where a verify step's host time goes)
#         bars           the open issues' bars of record in one call: lamina.bench.quant_speed --skip-kernels (issue
#                        #13's decode bars), then lamina.bench.spec at batch 1 on the prompt sets (off, control, n-gram,
#                        the draft model, EAGLE; 3 repeats), then at 8, 32 and 128 rows (5 repeats; never slower)
#         spec-plain-prof  scripts/profile_spec.py on the draft model and EAGLE held plain at batch 1: step times by kind
#                        (no profiler), then device time by kernel (torch.profiler), each against off
#         spec-trace     scripts/trace_spec_policy.py on the default draft model, code and chat prompts at batch 1 (each
#                        window's arm, steps by kind and the policy's view: why it drafts or not)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0

run() {  # run NAME CMD...: tee the output to $OUT/NAME.log, remember a failure
    local name=$1
    shift
    echo "=== $name: $* ($(date -u +%H:%M:%S))"
    local start=$SECONDS
    set -o pipefail
    "$@" 2>&1 | tee "$OUT/$name.log" | grep -v "^ok " || { echo "!!! $name failed"; status=1; }
    echo "=== $name took $((SECONDS - start)) s"
}

spec_big() {  # spec_big NAME REPEATS TIMEOUT [METHODS]: n-gram and the draft model against off at 128 and 256 rows
    run "$1" timeout "$3" python -m lamina.bench.spec --methods "${4:-ngram,draft_model}" --prompt-sets "" \
        --batch-sizes 128,256 --concurrency "" --new-tokens 512 --repeats "$2" --disable-tqdm --result-file "$OUT/$1.json"
}

offline() {  # offline NAME WORKLOAD SHAPE PEER
    run "$1" python -m lamina.bench.offline --workload "$2" --shape "$3" --peer "$4" --result-file "$OUT/$1.json"
}

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
for step in "$@"; do
    case $step in
        check) run gpu_check python scripts/gpu_check.py --quick ;;
        gemv) run gemv python -m lamina.bench.gemv_sweep --result-file "$OUT/gemv.json" ;;
        w1) offline w1 w1 qwen3-0.6b none ;;
        w1-peer) offline w1-peer w1 qwen3-0.6b hf ;;
        w2-qwen) offline w2-qwen w2 qwen3-0.6b none ;;
        w2-qwen-peer) offline w2-qwen-peer w2 qwen3-0.6b hf ;;
        w2-llama) offline w2-llama w2 llama3-8b none ;;
        w2-llama-peer) offline w2-llama-peer w2 llama3-8b hf ;;
        profile) run profile python scripts/profile_decode.py --shape qwen3-0.6b ;;
        sampling) run sampling python -m lamina.bench.sampling --result-file "$OUT/sampling.json" ;;
        w1-sweep) run w1-sweep python -m lamina.bench.w1_sweep --result-file "$OUT/w1-sweep.json" ;;
        w4-sweep) run w4-sweep python -m lamina.bench.w4_sweep --result-file "$OUT/w4-sweep.json" ;;
        startup)
            for shape in qwen3-0.6b llama3-8b; do
                cache=$(mktemp -d)
                for kind in cold warm; do
                    TRITON_CACHE_DIR=$cache run "startup-$shape-$kind" python -m lamina.bench.startup \
                        --shape "$shape" --result-file "$OUT/startup-$shape-$kind.json"
                done
            done ;;
        quant-speed) run quant-speed python -m lamina.bench.quant_speed ;;
        quant-speed-quick) run quant-speed python -m lamina.bench.quant_speed --no-sweep --budget-s 60 ;;
        spec-ngram) run spec-ngram python -m lamina.bench.spec --methods ngram,ngram-fixed --new-tokens 256 \
                        --batch-sizes 1,8,128 --repeats 2 --result-file "$OUT/spec-ngram.json" ;;
        spec) run spec python -m lamina.bench.spec --methods ngram,ngram-fixed,draft_model,eagle,medusa,early_exit \
                  --new-tokens 256 --batch-sizes 1,8,32,128 --repeats 3 --result-file "$OUT/spec.json" ;;
        w8a8-speed) run w8a8-speed python -m lamina.bench.w8a8_speed --result-file "$OUT/w8a8-speed.json" ;;
        spec-eagle) run spec-eagle python -m lamina.bench.spec --methods eagle,draft_model,ngram,ngram-fixed \
                        --new-tokens 256 --batch-sizes 1,8,128 --repeats 2 --result-file "$OUT/spec-eagle.json" ;;
        spec-check) run spec-check python scripts/spec_gpu_check.py --result-file "$OUT/spec-check.json" \
                        --methods ngram,ngram@3,draft_model,early_exit,eagle ;;
        spec-graphs) run spec-graphs python -m lamina.bench.spec --new-tokens 256 --batch-sizes 1,8,128 --repeats 3 \
                         --methods ngram,ngram-fixed,ngram@3,ngram-fixed@3,eagle,draft_model \
                         --result-file "$OUT/spec-graphs.json" ;;
        spec-projection) run spec-projection python -m lamina.bench.spec_projection --k 7 \
                             --result-file "$OUT/spec-projection-k7.json" ;;
        eagle-train)
            run eagle-train env OUT="$OUT" bash scripts/demo_model/eagle_device.sh ;;
        spec-batch) run spec-batch python -m lamina.bench.spec --methods ngram,ngram-fixed --prompt-sets "" --repeats 5 \
                        --new-tokens 256 --batch-sizes 1,8,32,128,256 --result-file "$OUT/spec-batch.json" ;;
        spec-final) run spec-final python -m lamina.bench.spec --methods ngram,ngram-fixed --new-tokens 256 \
                        --batch-sizes 1,8,32,128,256 --repeats 3 --result-file "$OUT/spec-final.json" ;;
        spec-gate) run spec-gate python -m lamina.bench.spec --methods ngram,ngram-fixed --new-tokens 256 \
                       --batch-sizes 1,8,32,128,256 --concurrency 8,32,128,256 --repeats 3 \
                       --result-file "$OUT/spec-gate.json" ;;
        spec-gate-models) run spec-gate-models python -m lamina.bench.spec --methods draft_model,eagle \
                              --prompt-sets "" --new-tokens 256 --batch-sizes 1,8,32 --concurrency 8,32 --repeats 3 \
                              --result-file "$OUT/spec-gate-models.json" ;;
        spec-gate-batch) run spec-gate-batch python -m lamina.bench.spec --methods ngram,ngram-fixed --prompt-sets "" \
                             --new-tokens 256 --batch-sizes 1,8,32,128,256 --concurrency 8,32,128,256 --repeats 5 \
                             --result-file "$OUT/spec-gate-batch.json" ;;
        kv-fp8)
            run kv-fp8-check env PYTHONPATH=. python scripts/fp8_kv_gpu_check.py --result-file "$OUT/kv-fp8-check.json"
            run kv-fp8-sweep env PYTHONPATH=. python scripts/fp8_kv_decode_sweep.py \
                --result-file "$OUT/kv-fp8-decode-sweep.json"
            for kv in auto fp8; do
                run "w1-kv-$kv" python -m lamina.bench.offline --workload w1 --shape qwen3-0.6b --kv-cache-dtype "$kv" \
                    --result-file "$OUT/w1-kv-$kv.json"
            done ;;
        spec-gate-trace) run spec-gate-trace env PYTHONPATH=. python scripts/trace_spec_gate.py \
                             --result-file "$OUT/spec-gate-trace.json" ;;
        quant-engine) run quant-engine python -m lamina.bench.quant_speed --skip-kernels ;;
        mma-sweep) run mma-sweep env PYTHONPATH=. python scripts/wna16_mma_sweep.py ;;
        spec-decision) run spec-decision python -m lamina.bench.spec_decision --result-file "$OUT/spec-decision.json" ;;
        quant-w8a8) run quant-w8a8 python scripts/quant_w8a8_gpu_check.py --result-file "$OUT/quant-w8a8.json" ;;
        mem-check) run mem-check env PYTHONPATH=. python scripts/engine_memory_check.py \
                       --result-file "$OUT/mem-check.json" ;;
        fp8-static) run fp8-static env PYTHONPATH=. python scripts/fp8_static_gpu_check.py --check h200_payload/fp8 \
                        --result-file "$OUT/fp8-static.json" ;;
        profile-quant)
            for scheme in bf16 int8 int4; do
                run "profile-$scheme" python scripts/profile_decode.py --shape llama3-8b --scheme "$scheme" \
                    --result-file "$OUT/profile-$scheme.json"
            done ;;
        spec-batch-trace) run spec-batch-trace env PYTHONPATH=. python scripts/trace_spec_batch.py \
                              --result-file "$OUT/spec-batch-trace.json" ;;
        quant-w8a8-layers) run quant-w8a8 python scripts/quant_w8a8_gpu_check.py --skip-models \
                               --result-file "$OUT/quant-w8a8.json" ;;
        profile-w1)
            for scheme in bf16 fp8; do
                run "profile-w1-$scheme" python scripts/profile_decode.py --shape llama3-8b --scheme "$scheme" \
                    --batch 128 --prompt-len 1000 --steps 8 --result-file "$OUT/profile-w1-$scheme.json"
            done
            run "profile-w1-fp8-kv8" python scripts/profile_decode.py --shape llama3-8b --scheme fp8 --batch 128 \
                --prompt-len 1000 --steps 8 --kv-cache-dtype fp8 --result-file "$OUT/profile-w1-fp8-kv8.json" ;;
        kv-fp8-sweep) run kv-fp8-sweep env PYTHONPATH=. python scripts/fp8_kv_decode_sweep.py \
                          --result-file "$OUT/kv-fp8-decode-sweep.json" ;;
        fp8-stack)
            run kv-fp8-check env PYTHONPATH=. python scripts/fp8_kv_gpu_check.py --result-file "$OUT/kv-fp8-check.json"
            run kv-fp8-sweep env PYTHONPATH=. python scripts/fp8_kv_decode_sweep.py \
                --result-file "$OUT/kv-fp8-decode-sweep.json"
            run profile-w1-fp8-kv8 python scripts/profile_decode.py --shape llama3-8b --scheme fp8 --batch 128 \
                --prompt-len 1000 --steps 8 --kv-cache-dtype fp8 --result-file "$OUT/profile-w1-fp8-kv8.json"
            run w8a8-speed python -m lamina.bench.w8a8_speed --schemes bf16,fp8,fp8+kv8 \
                --result-file "$OUT/w8a8-speed.json" ;;
        spec-tree)
            methods=draft_model-fixed,draft_model-fixed+tree,eagle-fixed,eagle-fixed+tree
            run spec-tree-check timeout 120 env PYTHONPATH=. python scripts/spec_draft_sampling_check.py \
                --engines off,self_tree,draft_model_tree,medusa_tree --result-file "$OUT/spec-tree-check.json"
            run spec-tree-steps timeout 60 env PYTHONPATH=. python scripts/profile_spec.py --methods "$methods" --profiler none
            run spec-tree timeout 250 python -m lamina.bench.spec --methods "$methods" --batch-sizes 1 \
                --concurrency "" --new-tokens 256 --repeats 3 --disable-tqdm --result-file "$OUT/spec-tree.json" ;;
        spec-profile-128) run spec-profile-128 timeout 200 env PYTHONPATH=. python scripts/profile_spec.py \
                              --batch-size 128 --methods ngram --new-tokens 256 --top 40 ;;
        spec-tree-f32) run spec-tree-f32 timeout 200 env PYTHONPATH=. python scripts/spec_draft_sampling_check.py \
                           --engines off,self_tree,draft_model_tree,medusa_tree --dtype float32 \
                           --result-file "$OUT/spec-tree-f32.json" ;;
        spec-big) spec_big spec-big 3 130 ;;
        spec-big-stalls) spec_big spec-big-stalls 5 420 ;;
        spec-big-6) spec_big spec-big-6 6 480 ;;
        spec-big-control) spec_big spec-big-control 8 540 control,ngram,draft_model ;;
        spec-big-precise) run spec-big-precise timeout 560 python -m lamina.bench.spec \
                              --methods control,ngram,draft_model --prompt-sets "" --batch-sizes 8,32,128,256 \
                              --concurrency "" --new-tokens 256 --repeats 24 --disable-tqdm \
                              --result-file "$OUT/spec-big-precise.json" ;;
        spec-b1-control) run spec-b1-control timeout 400 python -m lamina.bench.spec --methods control,ngram,draft_model \
                             --batch-sizes "" --concurrency "" --new-tokens 256 --repeats 8 --disable-tqdm \
                             --result-file "$OUT/spec-b1-control.json" ;;
        spec-b1) run spec-b1 timeout 400 python -m lamina.bench.spec --methods ngram,draft_model,draft_model-fixed@3 \
                     --batch-sizes "" --concurrency "" --new-tokens 256 --repeats 3 --disable-tqdm \
                     --result-file "$OUT/spec-b1.json" ;;
        spec-b1-plain) run spec-b1-plain timeout 150 env PYTHONPATH=. python scripts/profile_spec.py \
                           --methods draft_model,ngram --new-tokens 512 --profiler none ;;
        spec-host)
            host="timeout 150 env PYTHONPATH=. python scripts/profile_spec.py --methods draft_model-fixed@3 --new-tokens 512"
            run spec-host-profiler-none $host --profiler none
            run spec-host-profiler-cprofile-top-45 $host --profiler cprofile --top 45
            run spec-host-profiler-cprofile-sort-cumtime $host --profiler cprofile --sort cumtime --top 70
            run spec-host-profiler-timeline $host --profiler timeline ;;
        spec-trace) run spec-trace timeout 150 env PYTHONPATH=. python scripts/trace_spec_policy.py --methods draft_model \
                        --prompt-sets code,chat --result-file "$OUT/spec-trace.json" ;;
        spec-plain-prof)
            plain="timeout 200 env PYTHONPATH=. python scripts/profile_spec.py --methods draft_model-plain,eagle-plain"
            run spec-plain-none $plain --new-tokens 512 --profiler none
            run spec-plain-torch $plain --new-tokens 256 --profiler torch --top 30 ;;
        bars)  # the shortest first; the three together stay under one call's 600 s
            run bars-quant timeout 150 python -m lamina.bench.quant_speed --skip-kernels
            run bars-spec-b1 timeout 200 python -m lamina.bench.spec --methods control,ngram,draft_model,eagle \
                --batch-sizes "" --concurrency "" --new-tokens 256 --repeats 3 --disable-tqdm \
                --result-file "$OUT/bars-spec-b1.json"
            run bars-spec-rows timeout 210 python -m lamina.bench.spec --methods control,ngram,draft_model \
                --prompt-sets "" --batch-sizes 8,32,128 --concurrency "" --new-tokens 256 --repeats 5 --disable-tqdm \
                --result-file "$OUT/bars-spec-rows.json" ;;
        *) echo "unknown step: $step"; status=2 ;;
    esac
done
exit $status
