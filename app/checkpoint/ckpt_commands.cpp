// The ckpt commands. Norms are computed by reading each tensor in row blocks of at most 64 MiB (flat
// ranges when one row is longer), so inspecting a large checkpoint needs little memory and also
// verifies every chunk's checksum.
#include "app/checkpoint/ckpt_commands.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <utility>
#include <vector>

#include "app/checkpoint/adapter_checkpoint.h"
#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/hf_export.h"
#include "app/checkpoint/peft_export.h"
#include "kernels/check.h"

namespace tessera {

namespace {

constexpr int64_t kBlockElements = int64_t{16} << 20;

// Calls f with t's values in blocks of whole rows, at most kBlockElements each, or in flat ranges
// of kBlockElements when one row is longer.
template <class F>
void for_each_block(const CheckpointReader& r, const TensorInfo& t, F&& f) {
  const Shape& s = t.shape;
  if (s.ndim() == 0 || s.numel() == 0) return;
  const int64_t row = s.numel() / s[0];
  std::vector<float> buf;
  if (row > kBlockElements) {  // one row is over the block: flat ranges, which may cut rows
    for (int64_t e0 = 0; e0 < s.numel(); e0 += kBlockElements) {
      const int64_t n = std::min(kBlockElements, s.numel() - e0);
      buf.resize(static_cast<size_t>(n));
      r.read(t.path, TensorSlice::kFlat, e0, Shape{n}, buf.data());
      f(buf);
    }
    return;
  }
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(row, 1));
  for (int64_t r0 = 0; r0 < s[0]; r0 += rows_per_block) {
    Shape part = s;
    part[0] = std::min(rows_per_block, s[0] - r0);
    buf.resize(static_cast<size_t>(part.numel()));
    r.read(t.path, 0, r0, part, buf.data());
    f(buf);
  }
}

double l2_norm(const CheckpointReader& r, const TensorInfo& t) {
  double sum = 0.0;
  for_each_block(r, t, [&](const std::vector<float>& b) {
    for (float v : b) sum += static_cast<double>(v) * v;
  });
  return std::sqrt(sum);
}

// The /model tensors holding NaN or inf, each with how many such values: a diverged run's
// checkpoint would export as a model that produces NaN.
std::vector<std::pair<std::string, int64_t>> nonfinite_model_tensors(const CheckpointReader& r) {
  std::vector<std::pair<std::string, int64_t>> bad;
  for (const TensorInfo& t : r.tensors()) {
    if (t.path.rfind("/model/", 0) != 0 || t.dtype != "float32") continue;
    int64_t n = 0;
    for_each_block(r, t, [&](const std::vector<float>& b) {
      for (float v : b) n += !std::isfinite(v);
    });
    if (n > 0) bad.emplace_back(t.path, n);
  }
  return bad;
}

// 124439808 -> "124,439,808"
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// 124439808 -> "124.4M"
std::string human(int64_t n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.1f%s", v, units[u]);
  return buf;
}

std::string value_str(const AttrValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", *d);
    return buf;
  }
  return "\"" + std::get<std::string>(v) + "\"";
}

std::string pad(const std::string& s, size_t width) { return s + std::string(width > s.size() ? width - s.size() : 1, ' '); }

void print_meta(const CheckpointReader& r, std::ostream& out) {
  const CheckpointMeta& m = r.meta();
  const size_t w = 18;
  out << pad("checkpoint", w) << r.path() << "\n";
  out << pad("format version", w) << m.format_version << "\n";
  out << pad("tessera version", w) << m.tessera_version << "\n";
  out << pad("step", w) << with_commas(m.step) << "\n";
  out << pad("tokens seen", w) << with_commas(m.tokens_seen) << "\n";
  out << pad("consumed samples", w) << with_commas(m.consumed_samples) << "\n";
  for (const auto& [key, value] : m.extra) out << pad("/meta " + key, w) << value_str(value) << "\n";
  for (const auto& [group, attrs] : r.group_attributes())
    for (const auto& [key, value] : attrs) out << pad(group + " " + key, w) << value_str(value) << "\n";
}

void print_tensors(const CheckpointReader& r, std::ostream& out) {
  size_t name_w = 6, shape_w = 5;
  for (const TensorInfo& t : r.tensors()) {
    name_w = std::max(name_w, t.path.size());
    shape_w = std::max(shape_w, t.shape.str().size());
  }
  out << "\n" << pad("tensor", name_w + 2) << pad("shape", shape_w + 2) << pad("dtype", 9) << "L2 norm\n";
  int64_t model_params = 0;
  for (const TensorInfo& t : r.tensors()) {
    std::string norm = "-";
    if (t.dtype == "float32") {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", l2_norm(r, t));
      norm = buf;
    }
    out << pad(t.path, name_w + 2) << pad(t.shape.str(), shape_w + 2) << pad(t.dtype, 9) << norm << "\n";
    if (t.path.rfind("/model/", 0) == 0) model_params += t.shape.numel();
  }
  out << "\n/model parameters: " << with_commas(model_params) << " (" << human(model_params) << ")\n";
}

}  // namespace

int run_ckpt_inspect(const CkptInspectArgs& args, std::ostream& out) {
  CheckpointReader reader(args.file, MPI_COMM_SELF);
  print_meta(reader, out);
  print_tensors(reader, out);
  if (args.show_config) out << "\nconfig:\n" << reader.meta().config_toml << (reader.meta().config_toml.ends_with('\n') ? "" : "\n");
  return 0;
}

int run_ckpt_export(const CkptExportArgs& args, std::ostream& out) {
  TESSERA_CHECK(args.format == "safetensors", "ckpt export: format \"", args.format,
                "\" is not supported; the only format is safetensors");
  // An adapters-only LoRA checkpoint with its base (app/checkpoint/adapter_checkpoint.h).
  const std::unique_ptr<CheckpointReader> opened = open_model_checkpoint(args.file, MPI_COMM_SELF);
  const CheckpointReader& reader = *opened;
  if (!args.allow_non_finite) {
    const auto bad = nonfinite_model_tensors(reader);
    std::string names;
    for (size_t i = 0; i < bad.size() && i < 5; ++i)
      names += (i ? ", " : "") + bad[i].first + " (" + with_commas(bad[i].second) + (bad[i].second == 1 ? " value)" : " values)");
    if (bad.size() > 5) names += " and " + std::to_string(bad.size() - 5) + " more tensors";
    TESSERA_CHECK(bad.empty(), "ckpt export: ", args.file, " holds non-finite values (NaN or inf) in ", names,
                  ": the exported model would produce NaN. Export an earlier checkpoint, or pass --allow-non-finite "
                  "to export it as it is");
  }
  TESSERA_CHECK(!(args.adapters_only && args.merge_lora), "ckpt export: --adapters-only and --merge-lora exclude each "
                "other (a PEFT adapter folder, or a plain model with the adapters merged): pass one");
  TESSERA_CHECK(args.adapters_only || args.base_model.empty(), "ckpt export: --base-model goes with --adapters-only");
  if (args.adapters_only) {
    const PeftExportSummary p = export_peft_adapter(reader, args.out_dir, args.base_model);
    out << "wrote " << args.out_dir << "/adapter_model.safetensors (PEFT LoRA, " << p.tensors << " tensors, "
        << with_commas(p.parameters) << " parameters) and adapter_config.json (base_model_name_or_path \""
        << p.base_model << "\")\n";
    return 0;
  }
  const HfExportSummary s = export_hf_safetensors(reader, args.out_dir, args.vocab_dir, args.merge_lora);
  out << "wrote " << args.out_dir << "/model.safetensors (" << s.architecture << ", " << s.tensors << " tensors, "
      << with_commas(s.parameters) << " parameters), config.json, generation_config.json and the " << s.tokenizer
      << " tokenizer (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json)\n";
  return 0;
}

}  // namespace tessera
