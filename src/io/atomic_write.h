// Writes a whole file so that readers see the old content or the new, never a part: the text
// goes to PATH.tmp, then a rename replaces PATH. UserError naming the file when it cannot be
// written (missing folder, full disk).
#pragma once

#include <string>

namespace hyperparallel::io {

void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace hyperparallel::io
