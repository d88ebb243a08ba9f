// The subcommands that exist today. A command is registered only once it works.
#include "app/commands.h"

#include <iostream>
#include <memory>

#include "app/build_info.h"
#include "app/trainer.h"

namespace tessera {

namespace {
void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the build: version, CPU features, BLAS, threads, CUDA");
  cmd->callback([] { std::cout << build_info(); });
}
void register_train(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("config", args->config_path, "Config file (TOML), e.g. configs/quickstart.toml")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set section.key=value (repeatable)");
  cmd->add_option("--run-dir", args->run_dir, "Run directory (default: <log.dir>/<train.name>)");
  cmd->add_flag("--print-config", args->print_config, "Print the resolved config (defaults filled in) and exit");
  cmd->callback([args, &exit_code] { exit_code = run_train_command(*args); });
}
}  // namespace

void register_commands(CLI::App& app, int& exit_code) {
  register_info(app);
  register_train(app, exit_code);
}

}  // namespace tessera
