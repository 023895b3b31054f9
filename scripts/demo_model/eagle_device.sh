#!/usr/bin/env bash
# Train the demo EAGLE-3 head on one GPU over the demo model's whole corpus (corpus.py, the shipped tokenizer),
# fresh windows through the target every step (lamina distill --method eagle --online), and evaluate the
# shipped head on the same held-out data for comparison (one step at a vanishing learning rate).
#   OUT=out scripts/demo_model/eagle_device.sh      (BUDGET=300: training seconds; LR, HEAD_ARGS, RUN, WORK,
#   DEVICE below; CORPUS_BYTES=300000000 the corpus size; SHIPPED_EVAL=0 skips scoring the shipped head)
# $OUT receives $RUN.tgz (the head, its distill_summary.json), shipped_summary.json and the logs.
set -euo pipefail
OUT=${OUT:-out}
WORK=${WORK:-/tmp/eagle_work}
BUDGET=${BUDGET:-300}
LR=${LR:-1e-3}
HEAD_ARGS=${HEAD_ARGS---head-intermediate-size 2048}  # the shipped head's (HEAD_ARGS= for none); more options too
RUN=${RUN:-demo-eagle-gpu}  # the head's directory under $WORK, packed as $OUT/$RUN.tgz
DEVICE=${DEVICE:-cuda}  # cpu works too but is slow: its 30,000-token evaluation alone takes over 10 minutes
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=. PYTHONUNBUFFERED=1
stage() { echo "=== [$SECONDS s] $*"; }

if [ ! -f "$WORK/data/meta.json" ]; then  # a second run in the same $WORK reuses the tokens
    stage corpus
    python3 scripts/demo_model/corpus.py --out "$WORK/corpus" --max-total-bytes "${CORPUS_BYTES:-300000000}"
    stage tokenize
    python3 scripts/demo_model/tokenize_corpus.py --corpus "$WORK/corpus" --tokenizer lamina/assets/demo-model \
        --out "$WORK/data"
fi
cp "$WORK/corpus/manifest.json" "$OUT/corpus_manifest.json"
common=(--method eagle --teacher lamina/assets/demo-model --data "$WORK/data" --device "$DEVICE" --batch-size 64
        --seq-len 512 --ttt-steps 3 --kl-weight 0 --ce-weight 1 --eval-tokens 30000 --agreement-positions 2048
        --no-progress)
if [ "${SHIPPED_EVAL:-1}" = 1 ]; then
    stage "the shipped head, evaluated"
    python3 -m lamina.distill "${common[@]}" --out "$WORK/shipped" --init-from lamina/assets/demo-eagle \
        --steps 1 --lr 1e-12 --warmup-steps 0 --train-tokens 40000 --log-every 1 2>&1 \
        | tee "$OUT/shipped-eval.log" | tail -5
    cp "$WORK/shipped/distill_summary.json" "$OUT/shipped_summary.json"
fi
stage "training for ${BUDGET}s"
python3 -m lamina.distill "${common[@]}" --out "$WORK/$RUN" --online --train-tokens 4000000 \
    --self-generated 1000000 --time-budget "$BUDGET" --lr "$LR" --warmup-steps 100 --log-every 500 $HEAD_ARGS \
    2>&1 | tee "$OUT/eagle-train.log" | tail -60
tar -czf "$OUT/$RUN.tgz" -C "$WORK" "$RUN"
python3 - "$WORK/$RUN/distill_summary.json" "$WORK/shipped/distill_summary.json" <<'PY'
import json, os, sys
for name, path in zip(("new", "shipped"), filter(os.path.exists, sys.argv[1:])):
    ev = json.load(open(path))["eval"]
    print(name, {k: (v["top1"], v["mean_accepted"]) for k, v in ev.items() if isinstance(v, dict) and "top1" in v})
PY
stage done
