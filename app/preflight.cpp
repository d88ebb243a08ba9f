// Writable directories (a probe file), finite checkpoints, and the keys whose change since a
// checkpoint changes the data order.
#include "app/preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "kernels/check.h"
#include "kernels/elementwise.h"

namespace tessera {

namespace fs = std::filesystem;

void check_writable_directory(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSERA_CHECK(!ec, "cannot create ", what, " ", dir, ": ", ec.message());
  TESSERA_CHECK(fs::is_directory(dir, ec), what, " ", dir, " is not a directory");
  // Permissions and mount flags say less than trying: root ignores modes, a read-only mount or a
  // full quota refuses root too. One byte written and removed.
  const std::string probe = (fs::path(dir) / (".tessera_write_probe_" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  TESSERA_CHECK(fd >= 0, "cannot write to ", what, " ", dir, ": ", std::strerror(errno),
                "; choose a writable directory before training (nothing could be saved)");
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1;
  const int write_errno = errno;
  const bool closed = ::close(fd) == 0;
  const int close_errno = errno;
  ::unlink(probe.c_str());
  TESSERA_CHECK(wrote && closed, "cannot write to ", what, " ", dir, ": ",
                std::strerror(wrote ? close_errno : write_errno),
                "; choose a writable directory before training (nothing could be saved)");
}

void check_writable_directories(const std::string& run_dir, const Config& cfg, bool run_dir_from_flag) {
  check_writable_directory(run_dir, run_dir_from_flag ? "the run directory (--run-dir)"
                                                      : "the run directory (log.dir / train.name)");
  const std::string ckpt = checkpoint_dir(cfg, run_dir);
  if (ckpt.empty()) return;
  check_writable_directory(ckpt, cfg.checkpoint.dir.empty()
                                     ? "the checkpoint directory (<run dir>/checkpoints; checkpoint.dir moves it)"
                                     : "the checkpoint directory (checkpoint.dir)");
}

std::string nonfinite_tensor_in(const Exec& ex, Allocator& alloc, const std::string& checkpoint,
                                const ParameterStore& params, const OptimizerState& moments) {
  // Every tensor's sum of squares on the state's device, read at once. A sum of squares in double
  // is finite exactly when every float is (FLT_MAX^2 x 2^63 < DBL_MAX).
  std::vector<std::pair<Tensor, std::string>> tensors;
  for (const ParamEntry& e : params.entries()) {
    const int64_t n = e.local_shape.numel();
    tensors.emplace_back(params.flat_params().view({params.numel()}).slice_rows(e.offset, e.offset + n), e.spec.name);
    if (e.frozen) continue;  // no moments; the trainable ones lie at the layout of the trainable region
    const int64_t at = e.offset - params.frozen_numel();
    for (const auto& [m, suffix] : {std::pair{&moments.exp_avg, "/exp_avg"}, std::pair{&moments.exp_avg_sq, "/exp_avg_sq"}})
      if (m->defined()) tensors.emplace_back(m->view({m->numel()}).slice_rows(at, at + n), "optim/" + e.spec.name + suffix);
  }
  std::vector<std::string> bad;
  if (!tensors.empty()) {
    const Buffer sq(alloc, DType::F64, {static_cast<int64_t>(tensors.size())}, MemCategory::Workspace);
    for (size_t i = 0; i < tensors.size(); ++i)
      squared_norm(ex, sq.tensor().slice_rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1), tensors[i].first);
    const std::vector<double> sqs = read_values(ex, sq);
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!std::isfinite(sqs[i])) bad.push_back(tensors[i].second);
  }
  if (bad.empty()) return "";
  std::string names;
  for (size_t i = 0; i < bad.size() && i < 5; ++i) names += (i ? ", " : "") + bad[i];
  if (bad.size() > 5) names += " and " + std::to_string(bad.size() - 5) + " more";
  return "checkpoint " + checkpoint + " holds non-finite values (NaN or inf) in " + names +
         ": the run that saved it had diverged, or the file is damaged. Resume from an earlier checkpoint "
         "(checkpoint.resume = \"PATH\") or start fresh (checkpoint.resume = \"none\")";
}

std::vector<std::string> data_order_changes(const std::string& stored_config_toml, const Config& now) {
  Config before;
  try {
    before = parse_config_string(stored_config_toml, "the checkpoint's config");
  } catch (const Error& e) {
    return {"cannot compare this run's config with the checkpoint's (" + std::string(e.what()) +
            "): changes of train.global_batch, train.seed or data.* since then would go unnoticed"};
  }
  std::vector<std::string> out;
  for (const ConfigChange& c : config_changes(before, now)) {
    if (c.key != "train.global_batch" && c.key != "train.seed" && c.key.rfind("data.", 0) != 0) continue;
    std::string effect =
        "this changes the data order (which samples the remaining steps see), so the run no longer reproduces "
        "one that was never interrupted";
    if (c.key == "data.val_examples" || c.key == "data.valid")
      effect = "this changes the evaluation: validation figures are not comparable with the earlier ones";
    else if (c.key == "data.vocab_dir")
      effect = "this changes only how samples are decoded for display";
    out.push_back(c.key + " changed since the checkpoint: " + c.before + " -> " + c.after + "; " + effect);
  }
  return out;
}

}  // namespace tessera
