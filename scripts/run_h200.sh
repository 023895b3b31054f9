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
#         spec-ngram     lamina.bench.spec, n-gram adaptive vs k fixed vs off (issue #12)
#         spec           lamina.bench.spec, every method (issue #12)
#         quant-w8a8     scripts/quant_w8a8_gpu_check.py (int8 / fp8 GEMMs, W8A8 layers and demo models vs reference)
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
        spec-ngram) run spec-ngram python -m lamina.bench.spec --methods ngram,ngram-fixed --new-tokens 256 \
                        --batch-sizes 1,8,128 --repeats 2 --result-file "$OUT/spec-ngram.json" ;;
        spec) run spec python -m lamina.bench.spec --methods ngram,ngram-fixed,draft_model,eagle,medusa,early_exit \
                  --new-tokens 256 --batch-sizes 1,8,32,128 --repeats 3 --result-file "$OUT/spec.json" ;;
        quant-w8a8) run quant-w8a8 python scripts/quant_w8a8_gpu_check.py --result-file "$OUT/quant-w8a8.json" ;;
        *) echo "unknown step: $step"; status=2 ;;
    esac
done
exit $status
