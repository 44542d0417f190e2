#!/usr/bin/env bash
# Installs every dependency of hybridlm from Debian 12 packages (and one npm package for the
# tokenizer cross-check). Idempotent and non-interactive; runs as root or through sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build ccache pkg-config
      libpcre2-dev nlohmann-json3-dev libcli11-dev libgtest-dev libopenblas-dev libdnnl-dev
      python3 python3-numpy
      clang libclang-rt-14-dev)  # OpenBLAS, oneDNN: only bench/gemm_bench.cc (the GEMM comparison). clang + its libFuzzer/sanitizer runtimes: scripts/fuzz.sh
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The independent tokenizer oracle for tests (pure JavaScript, pinned in tests/tokenizer/package.json).
if [ ! -d tests/tokenizer/node_modules/@huggingface/tokenizers ]; then
  echo "setup: npm install in tests/tokenizer"
  (cd tests/tokenizer && npm install --no-audit --no-fund --silent)
fi
