// Command-line list arguments of the tools ("--ranks 1,2,8", "--wait kernel,memop").
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace mktools {

// "a,b,c" -> {"a", "b", "c"}; empty items are dropped.
inline std::vector<std::string> splitCommas(const char* s) {
  std::vector<std::string> v;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) v.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return v;
}

// "1,2,8" -> {1, 2, 8}.
inline std::vector<int> parseIntList(const char* s) {
  std::vector<int> v;
  for (const std::string& item : splitCommas(s)) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace mktools
