#!/usr/bin/env bash
# Reproduce the demo models on one GPU, in two phases (each fits a 10-minute run):
#
#   scripts/demo_model/run_device.sh teacher   corpus -> tokenizer -> tokens -> teacher (time-budgeted)
#   scripts/demo_model/run_device.sh draft     corpus -> tokens (shipped tokenizer) -> `lamina distill`
#                                              (KL, time-budgeted) -> same student with plain CE for the
#                                              same steps -> evaluation of all three
#
# Phase 'draft' reads the teacher from lamina/assets/demo-model. Results go to $OUT (default ./out),
# packed so that each file stays under 16 MiB; scratch goes to $WORK (default /tmp/demo_work).
# DEADLINE (seconds, default 560) is the wall-clock budget of the phase; training gets what is left.
# For a quick CPU rehearsal, DEMO_* variables shrink the run (defaults are the shipped settings).
set -uo pipefail
phase=${1:?usage: run_device.sh teacher|draft}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
OUT=${OUT:-$repo/out}
WORK=${WORK:-/tmp/demo_work}
DEADLINE=${DEADLINE:-560}
deadline=$((SECONDS + DEADLINE))
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
cd "$repo"

# lamina.distill needs only torch/transformers; if the engine package fails to import, use it alone.
export PYTHONPATH=$repo
if ! python3 -c "import lamina.distill.trainer" 2>/dev/null; then
    echo "note: 'import lamina' failed here; running lamina.distill through an isolated package"
    mkdir -p "$WORK/shim/lamina" && : > "$WORK/shim/lamina/__init__.py"
    ln -sfn "$repo/lamina/distill" "$WORK/shim/lamina/distill"
    export PYTHONPATH=$WORK/shim
fi

CORPUS_BYTES=${DEMO_CORPUS_BYTES:-300000000}
BATCH=${DEMO_BATCH:-64}
SEQ=${DEMO_SEQ:-1024}
TEACHER_CONFIG=${DEMO_TEACHER_CONFIG:-scripts/demo_model/teacher_config.json}
DRAFT_CONFIG=${DEMO_DRAFT_CONFIG:-scripts/demo_model/draft_config.json}
TEACHER=${DEMO_TEACHER:-lamina/assets/demo-model}
COMPILE=${DEMO_COMPILE---compile}
EVAL_TOKENS=${DEMO_EVAL_TOKENS:+--eval-tokens $DEMO_EVAL_TOKENS}

left() { echo $((deadline - SECONDS)); }
limit() { local s=$(( deadline - SECONDS - $1 )); [ "$s" -lt 10 ] && s=10; echo "$s"; }  # for timeout
stage() { echo "=== [$SECONDS s] $*"; }

stage "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import sys, torch, transformers, tokenizers; print(sys.version.split()[0], torch.__version__, transformers.__version__, tokenizers.__version__)"

stage "corpus"
python3 scripts/demo_model/corpus.py --out "$WORK/corpus" --max-total-bytes "$CORPUS_BYTES" || exit 1
cp "$WORK/corpus/manifest.json" "$OUT/corpus_manifest.json"
if [ "$phase" = draft ] && [ -f scripts/demo_model/corpus_manifest.json ]; then
    python3 -c "import json; a, b = (json.load(open(p)) for p in ('scripts/demo_model/corpus_manifest.json', '$WORK/corpus/manifest.json')); print('corpus identical to the teacher run:', all(a[k] == b[k] for k in ('train_names_sha256', 'heldout_names_sha256')))"
fi

if [ "$phase" = teacher ]; then
    stage "tokenizer"
    python3 scripts/demo_model/train_tokenizer.py --corpus "$WORK/corpus" --out "$WORK/tokenizer" || exit 1
    tok=$WORK/tokenizer
else
    tok=$TEACHER
fi

stage "tokenize"
python3 scripts/demo_model/tokenize_corpus.py --corpus "$WORK/corpus" --tokenizer "$tok" --out "$WORK/data" || exit 1

if [ "$phase" = teacher ]; then
    budget=$(( $(left) - 50 ))
    stage "teacher: training for ${budget}s"
    python3 scripts/demo_model/train_teacher.py --config "$TEACHER_CONFIG" \
        --data "$WORK/data" --tokenizer "$tok" --out "$WORK/demo-model" --time-budget "$budget" \
        --batch-size "$BATCH" --seq-len "$SEQ" --lr 2e-3 --warmup-steps 200 $COMPILE $EVAL_TOKENS --no-progress
    stage "teacher: samples"
    timeout "$(limit 8)" python3 scripts/demo_model/evaluate.py --data "$WORK/data" \
        --teacher "$WORK/demo-model" --out "$OUT/teacher_eval.json" --max-new-tokens 64 --seq-len "$SEQ" $EVAL_TOKENS
    stage "pack"
    (cd "$WORK/demo-model" && split -b 15M model.safetensors "$OUT/model.safetensors.part-")
    tar -czf "$OUT/teacher_bundle.tar.gz" -C "$WORK" --exclude=model.safetensors demo-model \
        corpus/heldout_files.txt corpus/manifest.json data/meta.json
else
    # distillation and the CE baseline share seed, data order and step count
    common=(--teacher "$TEACHER" --student-config "$DRAFT_CONFIG" --data "$WORK/data" --batch-size "$BATCH"
            --seq-len "$SEQ" --lr 2e-3 --warmup-steps 100 $COMPILE --eval-tokens 0 --agreement-positions 0
            --no-progress)
    budget=$(( ($(left) - 130) * 100 / 165 ))
    stage "distill (KL): ${budget}s"
    python3 -m lamina.distill "${common[@]}" --out "$WORK/demo-draft" --time-budget "$budget" \
        --kl-weight 1 --ce-weight 0
    steps=$(python3 -c "import json; print(json.load(open('$WORK/demo-draft/distill_summary.json'))['train']['steps'])")
    stage "baseline (CE): $steps steps"
    timeout "$(limit 75)" python3 -m lamina.distill "${common[@]}" --out "$WORK/draft-ce" \
        --steps "$steps" --kl-weight 0 --ce-weight 1
    stage "evaluate"
    timeout "$(limit 8)" python3 scripts/demo_model/evaluate.py --data "$WORK/data" \
        --teacher "$TEACHER" --draft "distilled=$WORK/demo-draft" --draft "ce-baseline=$WORK/draft-ce" \
        --out "$OUT/demo_eval.json" --max-new-tokens 64 --seq-len "$SEQ" $EVAL_TOKENS
    stage "pack"
    tar -czf "$OUT/draft_bundle.tar.gz" -C "$WORK" demo-draft
    tar -czf "$OUT/draft_ce_bundle.tar.gz" -C "$WORK" draft-ce
fi
stage "done"
ls -la "$OUT"
