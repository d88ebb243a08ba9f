// Subcommand registration: each command adds itself to the CLI11 app with a callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera {

// Each command's callback stores its exit status in exit_code.
void register_commands(CLI::App& app, int& exit_code);

}  // namespace tessera
