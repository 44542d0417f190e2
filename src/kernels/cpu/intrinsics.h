// The x86 intrinsics for the hand-written kernel files. GCC 12 reports its own intrinsics'
// _mm512_undefined_* placeholders as uninitialized (a known false positive of avx512fintrin.h);
// exactly those two warnings are silenced, for the rest of each file that includes this header.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
