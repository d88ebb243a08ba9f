// tessera: the single executable. Subcommands are registered here; each lives in app/.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "app/build_info.h"
#include "app/commands.h"
#include "app/launch.h"
#include "app/checkpoint/hdf5.h"
#include "kernels/allocator.h"
#include "kernels/check.h"
#include "kernels/cpu/blas_select.h"
#include "parallel/mpi.h"

namespace {

// Parses the command line and runs the command; errors are caught here.
int run_command(int argc, char** argv) {
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
  } catch (const std::exception& e) {
    // An error on this rank alone: the others may be waiting in a collective, so in a parallel
    // run the whole job is aborted (all ranks exit non-zero) instead of hanging.
    const bool parallel = tessera::comm_size(MPI_COMM_WORLD) > 1;
    const bool ours = dynamic_cast<const tessera::Error*>(&e) != nullptr;
    std::fprintf(stderr, "tessera: %s%s\n", ours ? "error: " : "unexpected error: ", e.what());
    if (parallel) {
      std::fprintf(stderr, "tessera: rank %d failed alone; aborting every rank\n", tessera::comm_rank(MPI_COMM_WORLD));
      std::fflush(nullptr);
      // MPICH's launcher kills every process as soon as the abort reaches it, and can drop output
      // it has not forwarded yet (seen: 3 runs in 20 lost this rank's message). A moment's wait
      // lets the message out first; the job is ending anyway.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return 1;
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // The BLAS kernels first, before anything calls the BLAS: where OpenBLAS fell back to a generic
  // core on a CPU with AVX2 or AVX-512, this switches it in place (kernels/cpu/blas_select.h). No
  // re-exec, so nothing here concerns mpiexec or srun: every rank does the same on its own.
  tessera::cpu::blas_selection();
  // Freed host memory stays with the process (kernels/allocator.h): the libraries' per-call scratch
  // (MPI's collectives) must not page-fault in afresh on every call.
  tessera::keep_freed_host_memory();
  // MPI lives for the whole run (MPICH runs a singleton when started without mpirun). Commands
  // take MPI_COMM_WORLD from here; errors are caught in run_command, so MPI_Finalize always runs.
  // A rank that never started would keep the others in MPI_Init for ever: bounded (app/launch.h).
  tessera::MpiInitDeadline init_deadline;
  tessera::MpiSession mpi(&argc, &argv);
  init_deadline.done();
  const int code = run_command(argc, argv);
  // HDF5 goes first: its shutdown inside MPI_Finalize would close files after MPI-IO is gone.
  switch (tessera::h5_shutdown()) {
    case tessera::H5Shutdown::Clean:
      break;
    case tessera::H5Shutdown::CorruptMetadataSeen:  // reported already (refused or skipped)
      std::fflush(nullptr);
      std::_Exit(code);
    case tessera::H5Shutdown::CloseFailed:
      std::fprintf(stderr, "tessera: an HDF5 file could not be closed; exiting without MPI_Finalize\n");
      std::fflush(nullptr);
      std::_Exit(code != 0 ? code : 1);
  }
  return code;
}
