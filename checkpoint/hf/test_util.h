#ifndef LOOM_CHECKPOINT_HF_TEST_UTIL_H_
#define LOOM_CHECKPOINT_HF_TEST_UTIL_H_

// Paths for checkpoint/hf tests: the committed reference data (made by
// tools/hf_reference/make_reference.py) and a fresh temporary folder.

#include <cstdlib>
#include <string>

#include "checkpoint/file_util.h"

namespace loom::checkpoint::hf::testing {

// checkpoint/hf/testdata/<name> in the test's runfiles.
inline std::string TestData(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string root;
  if (srcdir != nullptr && workspace != nullptr) root = std::string(srcdir) + "/" + workspace + "/";
  return root + "checkpoint/hf/testdata/" + name;
}

// A new empty folder under TEST_TMPDIR (or /tmp) named `name`.
inline std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  (void)RemoveTree(dir);
  (void)MakeDirs(dir);
  return dir;
}

}  // namespace loom::checkpoint::hf::testing

#endif  // LOOM_CHECKPOINT_HF_TEST_UTIL_H_
