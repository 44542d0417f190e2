#!/usr/bin/env bash
# Makes the small random-weight checkpoints the C++ model tests run on.
set -euo pipefail
tool=$1
out=$2
py=${HYBRIDLM_PYTHON:-/usr/bin/python3}
rm -rf "$out"
mkdir -p "$out"
"$py" "$tool" --preset mamba-tiny --out "$out/mamba1" --seed 1 --set time_step_rank=6 --set state_size=12 >/dev/null
"$py" "$tool" --preset falcon-mamba-tiny --out "$out/falcon_mamba" --seed 2 >/dev/null
"$py" "$tool" --preset mamba2-tiny --out "$out/mamba2_g2" --seed 3 --set n_groups=2 --set chunk_size=8 --untie >/dev/null
"$py" "$tool" --preset mamba2-tiny --out "$out/mamba2_bf16" --seed 4 --dtype bf16 >/dev/null
echo "fixtures written to $out"
