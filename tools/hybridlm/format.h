// Human-readable sizes for the CLI's reports.
#pragma once

#include <sys/resource.h>

#include <cstdarg>
#include <cstdio>
#include <string>

namespace hybridlm {

// 1536 -> "1.50 KiB"; below 1 KiB, whole bytes.
inline std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

// printf into a string (the CLI's report lines, which go through Engine::info).
__attribute__((format(printf, 1, 2))) inline std::string strprintf(const char* fmt, ...) {
  va_list a, b;
  va_start(a, fmt);
  va_copy(b, a);
  const int n = std::vsnprintf(nullptr, 0, fmt, a);
  va_end(a);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, b);
  va_end(b);
  return s;
}

// This process's peak resident set size so far (getrusage; Linux reports KiB).
inline double peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

}  // namespace hybridlm
