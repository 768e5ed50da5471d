// Whole-file writes through a temporary name. See atomic_write.h.
#include "io/atomic_write.h"

#include <filesystem>
#include <fstream>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::io {

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw UserError("cannot write " + tmp + " (does the folder exist? is the disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace hyperparallel::io
