// tessera: the single executable. Subcommands are registered here; each lives in app/.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "app/build_info.h"
#include "app/commands.h"
#include "kernels/check.h"
#include "parallel/mpi.h"

int main(int argc, char** argv) {
  // MPI lives for the whole run (MPICH runs a singleton when started without mpirun). Commands
  // take MPI_COMM_WORLD from here; errors are caught below, so MPI_Finalize always runs.
  tessera::MpiSession mpi(&argc, &argv);
  CLI::App app{"tessera: a standalone C++ trainer for large language models"};
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  tessera::register_commands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::CollectiveError& e) {
    // Every rank holds this same error: one prints it, all exit.
    if (tessera::comm_rank(MPI_COMM_WORLD) == 0) std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: unexpected error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
