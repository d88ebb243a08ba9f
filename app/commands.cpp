// The subcommands that exist today. A command is registered only once it works.
#include "app/commands.h"

#include <iostream>

#include "app/build_info.h"

namespace tessera {

namespace {
void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the build: version, CPU features, BLAS, threads, CUDA");
  cmd->callback([] { std::cout << build_info(); });
}
}  // namespace

void register_commands(CLI::App& app) {
  register_info(app);
}

}  // namespace tessera
