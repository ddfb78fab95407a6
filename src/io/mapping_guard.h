// A checkpoint file that is truncated or replaced while it is mapped makes the
// next read of a vanished page raise SIGBUS. The CLI turns that into a clean
// one-line error (exit code 2) instead of a crash: MappedFile registers each
// mapping here, and the handler names the file the faulting address is in.
#pragma once
#include <cstddef>
#include <string>

namespace dsv4 {

// Records / forgets a mapping of `size` bytes at `base` of the file `path`
// (which must stay alive until unregister_mapping). Thread-safe; a full table
// (4096 mappings) only loses the file name in the message.
void register_mapping(const void* base, size_t size, const std::string* path);
void unregister_mapping(const void* base);

// Installs the process-wide SIGBUS handler: it prints
//   dsv4: error: checkpoint file changed or truncated while mapped (SIGBUS): FILE
// (FILE when the address is in a registered mapping) on stderr and exits with
// code 2. Only async-signal-safe calls are made.
void install_sigbus_handler();

}  // namespace dsv4
