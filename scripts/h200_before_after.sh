#!/usr/bin/env bash
# Before/after on the H200 in one call (issue #11: "no speed regression, measured before/after in one run").
#
#   scripts/h200_before_after.sh BEFORE_TAR [REPEATS] [WORKLOADS]
#
# BEFORE_TAR: `git archive` of the old commit's lamina/ and scripts/ (made on the dev machine, carried). Each
# benchmark runs for the old tree and this tree alternately, REPEATS times (default 2) for W1, once for W2,
# each in a fresh process, sharing one Triton cache. WORKLOADS (default "check w1 w2": the kernel check of
# scripts/gpu_check.py first): "w1 w2" without the check; "w2-qwen" repeats W2 on Qwen3-0.6B REPEATS times. Logs and JSON are packed into $OUT/before-after.tgz;
# $OUT/before-after.json holds the table printed last.
set -u
OUT=${OUT:-out}
BEFORE_TAR=$1
REPEATS=${2:-2}
WORKLOADS=${3:-check w1 w2}
mkdir -p "$OUT" /tmp/ba/before /tmp/ba/res
tar -xf "$BEFORE_TAR" -C /tmp/ba/before
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ba/triton
AFTER=$(pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/ba/res/gpu.txt
if [ "$WORKLOADS" = "check w1 w2" ]; then
    (cd "$AFTER" && python scripts/gpu_check.py --quick > /tmp/ba/res/gpu_check.log 2>&1; echo "gpu_check rc=$?") \
        | tee -a /tmp/ba/res/gpu.txt
fi
bench() {  # bench TREE NAME ARGS...: one benchmark of one tree
    local tree=$1 name=$2
    shift 2
    local dir=$AFTER
    [ "$tree" = before ] && dir=/tmp/ba/before
    local start=$SECONDS
    (cd "$dir" && PYTHONPATH="$dir" python -m lamina.bench.offline "$@" --result-file "/tmp/ba/res/$tree-$name.json" \
        > "/tmp/ba/res/$tree-$name.log" 2>&1)
    echo "$tree $name rc=$? $((SECONDS - start)) s"
}
for i in $(seq "$REPEATS"); do
    for tree in before after; do
        case $WORKLOADS in
            w2-qwen) bench "$tree" "w2-qwen-$i" --workload w2 --shape qwen3-0.6b ;;
            *) bench "$tree" "w1-greedy-$i" --workload w1 --shape qwen3-0.6b --temperature 0
               bench "$tree" "w1-t0.6-$i" --workload w1 --shape qwen3-0.6b ;;
        esac
    done
done
if [ "$WORKLOADS" != w2-qwen ]; then
    for tree in before after; do
        bench "$tree" w2-qwen --workload w2 --shape qwen3-0.6b
        bench "$tree" w2-llama --workload w2 --shape llama3-8b
    done
fi
python - /tmp/ba/res "$OUT/before-after.json" <<'PY'
import json, pathlib, sys
res, rows = pathlib.Path(sys.argv[1]), {}
for path in sorted(res.glob("*.json")):
    tree, name = path.stem.split("-", 1)
    lamina = json.loads(path.read_text()).get("lamina", {})
    key = "decode_tok_per_s" if name.startswith("w2") else "tok_per_s"
    rows.setdefault(name, {})[tree] = lamina.get(key)
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
print("benchmark | before | after | after/before")
for name, r in rows.items():
    b, a = r.get("before"), r.get("after")
    print(f"{name} | {b} | {a} | {a / b:.3f}" if a and b else f"{name} | {b} | {a} |")
PY
tar -czf "$OUT/before-after.tgz" -C /tmp/ba res
