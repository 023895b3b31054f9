#!/usr/bin/env bash
# Train the demo EAGLE-3 head on a GPU (lamina distill --method eagle) and keep it in lamina/assets/demo-eagle
# when it beats the head there on greedy continuations (on-policy mean accepted length of a 3-draft chain).
#   scripts/demo_model/eagle_device.sh DATA_DIR CURRENT_MEAN_ACCEPTED     (DATA_DIR: medusa_data.py's output)
set -eu
OUT=${OUT:-out}
DATA=$1
CURRENT=$2
python -m lamina.distill --method eagle --teacher lamina/assets/demo-model --data "$DATA" --out "$OUT/demo-eagle-gpu" \
    --device cuda --train-tokens 3000000 --self-generated 500000 --time-budget 150 --batch-size 32 --seq-len 512 \
    --lr 3e-3 --warmup-steps 50 --kl-weight 0 --ce-weight 1 --eval-tokens 30000 --agreement-positions 2048 \
    --log-every 200 --ttt-steps 3 --no-progress 2>&1 | tee "$OUT/eagle-train.log" | tail -40
python - "$OUT/demo-eagle-gpu" "$CURRENT" <<'PY'
import json, shutil, sys
run, current = sys.argv[1], float(sys.argv[2])
accepted = json.load(open(f"{run}/distill_summary.json"))["eval"]["on_policy"]["mean_accepted"]
keep = accepted > current
print(f"GPU head: on-policy mean accepted {accepted} vs {current} shipped: {'kept' if keep else 'not kept'}")
if keep:
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{run}/{name}", f"lamina/assets/demo-eagle/{name}")
PY
