// Subcommand registration: each command adds itself to the CLI11 app with a callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera {

void register_commands(CLI::App& app);

}  // namespace tessera
