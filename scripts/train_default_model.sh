#!/bin/bash
# Trains the default model (models/default) from scratch with this engine: the King James Bible
# from Debian's bible-kjv (public domain; scripts/setup.sh installs it), verse references removed,
# a 4,096-token byte-level BPE trained on it, 90/10 train/validation split, then
# models/default/train.yaml. Writes the result (bf16 weights, config, tokenizer, metrics and loss
# curve) to models/default. About an hour on 2 cores.
#
#   bash scripts/train_default_model.sh [WORK_DIR]     (default: build/default-model)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${HYBRIDLM:-$ROOT/build/hybridlm}
WORK=${1:-$ROOT/build/default-model}
OUT=$ROOT/models/default
command -v bible >/dev/null || { echo "error: the bible program is missing: bash scripts/setup.sh installs bible-kjv" >&2; exit 1; }
mkdir -p "$WORK"
cd "$WORK"
# Genesis 1:1 to Revelation 22:21, one verse a line, without the "Ge1:1 " references.
bible -f gen1:1-rev22:21 | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' > kjv.txt
"$BIN" train-tokenizer -i kjv.txt --vocab-size 4096 -o tok
"$BIN" prepare-data --tokenizer tok -i kjv.txt -o data --val-fraction 0.1
cp "$OUT/train.yaml" train.yaml
"$BIN" train --config train.yaml
last=$(ls -d run/step-* | sort -t- -k2 -n | tail -1)
/usr/bin/python3 "$ROOT/scripts/export_bf16.py" "$last" "$OUT"
cp run/metrics.jsonl run/loss_curve.svg "$OUT/"
echo "wrote $OUT from $last"
