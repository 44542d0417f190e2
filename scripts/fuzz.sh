#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS (default 60) or
# 10 million executions, whichever comes first.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# A crash, leak, UB report or an input that runs over 1 s stops that target with a non-zero exit;
# the input is saved as build-fuzz/artifacts/<target>/crash-* (copy it into
# fuzz/regressions/<target>/ once fixed: every build replays that folder in ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_safetensors fuzz_index fuzz_config fuzz_tokenizer_load
                                      fuzz_tokenizer_encode fuzz_decode fuzz_npy fuzz_request fuzz_template)
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)"; exit 1; }
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -g1" -DHYBRIDLM_FUZZ=ON >/dev/null
cmake --build build-fuzz --target "${targets[@]}"
python3_bin=/usr/bin/python3
"$python3_bin" fuzz/make_seeds.py build-fuzz/seeds >/dev/null
export HYBRIDLM_TEST_DATA=${HYBRIDLM_TEST_DATA:-$(pwd)/tests/data}
# Several targets write each input to a scratch file; on tmpfs they run about 4x faster.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t"
  echo "== $t: ${secs}s"
  # The working corpus grows in build-fuzz/corpus/<t>; seeds and kept regressions are read-only inputs.
  # Chat templates get a Jinja dictionary, the rest the JSON one.
  dict=fuzz/json.dict
  [ "$t" = fuzz_template ] && dict=fuzz/jinja.dict
  if ! build-fuzz/fuzz/"$t" "build-fuzz/corpus/$t" "build-fuzz/seeds/$t" "fuzz/regressions/$t" \
        -dict="$dict" -max_total_time="$secs" -runs=10000000 -timeout=1 -rss_limit_mb=2048 -max_len=8192 \
        -artifact_prefix="build-fuzz/artifacts/$t/" -print_final_stats=1 2>"build-fuzz/$t.log"; then
    status=1
    echo "!! $t failed; see build-fuzz/$t.log and build-fuzz/artifacts/$t/"
    grep -E "ERROR|runtime error|SUMMARY|Test unit written" "build-fuzz/$t.log" | cut -c1-300 | head -8
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/$t.log" | tr '\n' ' '
  echo
done
exit $status
