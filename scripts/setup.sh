#!/usr/bin/env bash
# Installs every dependency of hybridlm from Debian 12 packages (and two npm packages for the
# tokenizer and chat-template cross-checks). Idempotent and non-interactive; runs as root or through sudo.
#   bash scripts/setup.sh            # what `make build` / `make test` need
#   bash scripts/setup.sh --aarch64  # also the aarch64 cross build (`make test-aarch64`)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
aarch64=0
for arg in "$@"; do
  case "$arg" in
    --aarch64) aarch64=1 ;;
    *) echo "usage: scripts/setup.sh [--aarch64]" >&2; exit 2 ;;
  esac
done

pkgs=(build-essential cmake ninja-build ccache pkg-config
      libpcre2-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libgtest-dev libopenblas-dev libdnnl-dev
      libcpp-httplib-dev  # hybridlm serve's HTTP layer (src/server/http_server.cc)
      libsentencepiece-dev  # tokenizer.model files (src/io/tokenizer_spm.cc; optional component)
      python3 python3-numpy
      python3-sentencepiece  # test oracle only: tests/tokenizer/spm_oracle_test.py
      python3-torch  # benchmark only: bench/train_bench.py
      sysbench  # benchmark only: bench/probe_check.py (bench's bandwidth probe against an independent tool)
      clang libclang-rt-14-dev  # OpenBLAS, oneDNN: only bench/gemm_bench.cc (the GEMM comparison). clang + its libFuzzer/sanitizer runtimes: scripts/fuzz.sh
      bible-kjv  # the KJV text the default model is trained on (scripts/train_default_model.sh)
      libopenmpi-dev openmpi-bin)  # Open MPI: data-parallel training (optional component; not in the aarch64 cross build)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)
# The aarch64 cross build: Debian's cross compiler, qemu-user to run its binaries, and the arm64
# builds of the three libraries we link (multiarch: the arm64 architecture is added to dpkg once;
# nlohmann-json and CLI11 are header-only, their host packages serve both). qemu runs the binaries
# on the multiarch arm64 runtime (libc6:arm64, which PCRE2 brings, and libstdc++6:arm64), not on
# the cross compiler's copy of it in /usr/aarch64-linux-gnu, so that ld.so and libc always match.
# yaml-cpp: only its arm64 runtime library; libyaml-cpp-dev is not multiarch (its arm64 build would
# replace the host's), and the cross build uses the host's headers (CMakeLists.txt).
# libsentencepiece: neither libsentencepiece-dev nor libsentencepiece0 is multiarch (installing
# the arm64 ones removes the host's and python3-sentencepiece), so the cross build has no
# SentencePiece support and its tests check the one-line refusal instead.
if [ "$aarch64" -eq 1 ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "setup: dpkg --add-architecture arm64"
    $SUDO dpkg --add-architecture arm64
  fi
  pkgs+=(g++-aarch64-linux-gnu qemu-user libpcre2-dev:arm64 libyaml-cpp0.7:arm64 libgtest-dev:arm64 libstdc++6:arm64)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The independent tokenizer oracle for tests (pure JavaScript, pinned in tests/tokenizer/package.json).
if [ ! -d tests/tokenizer/node_modules/@huggingface/tokenizers ]; then
  echo "setup: npm install in tests/tokenizer"
  (cd tests/tokenizer && npm install --no-audit --no-fund --silent)
fi

# The official OpenAI client (npm, pinned in tests/server/package.json) that the server tests drive.
if [ ! -d tests/server/node_modules/openai ]; then
  echo "setup: npm install in tests/server"
  (cd tests/server && npm install --no-audit --no-fund --silent)
fi

# The independent chat-template oracle (pure JavaScript, pinned in tests/chat/package.json).
if [ ! -d tests/chat/node_modules/@huggingface/jinja ]; then
  echo "setup: npm install in tests/chat"
  (cd tests/chat && npm install --no-audit --no-fund --silent)
fi
