// What a LoRA run freezes (the base model, every parameter that is not an adapter's) and the /lora
// record that ties its checkpoints to their base.
#include "app/lora.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "app/freeze.h"
#include "kernels/check.h"

namespace tessera {

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::set<std::string> lora_frozen_base(const std::vector<std::string>& names) {
  std::set<std::string> frozen;
  for (const std::string& n : names)
    if (!is_lora_parameter(n)) frozen.insert(n);
  return frozen;
}

namespace {
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull, kFnvPrime = 0x100000001b3ull;
void fnv1a(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
}
std::string hex(uint64_t v) {
  std::ostringstream os;
  os << std::hex << v;
  return os.str();
}
}  // namespace

uint64_t lora_base_checksum(const std::string& path, MPI_Comm comm) {
  const CheckpointReader r(path, comm);
  std::vector<std::string> names;
  for (const TensorInfo& t : r.tensors())
    if (t.path.rfind("/model/", 0) == 0 && !is_lora_parameter(t.path)) names.push_back(t.path);
  std::sort(names.begin(), names.end());
  uint64_t h = kFnvOffset;
  for (const std::string& n : names) {
    fnv1a(h, n.data(), n.size());
    const std::vector<float> v = r.read_all(n);
    fnv1a(h, v.data(), v.size() * sizeof(float));
  }
  return h;
}

AttrMap lora_record(const std::string& init_from, const LoraConfig& cfg, MPI_Comm comm) {
  AttrMap rec;
  rec["base"] = init_from.empty() ? std::string() : std::filesystem::absolute(init_from).lexically_normal().string();
  rec["base_checksum"] = init_from.empty() ? std::string() : "fnv1a64:" + hex(lora_base_checksum(init_from, comm));
  rec["rank"] = cfg.rank;
  rec["alpha"] = cfg.alpha;
  std::string targets;
  for (const std::string& t : cfg.targets) targets += (targets.empty() ? "" : ",") + t;
  rec["targets"] = targets;
  return rec;
}

void lora_check_base(const std::string& checkpoint, const AttrMap& record, MPI_Comm comm) {
  TESSERA_CHECK(!record.empty(), "[lora]: checkpoint ", checkpoint, " has no /lora record (it was not saved by a "
                "LoRA run): resume it without [lora], or start the LoRA run from it with checkpoint.init_from");
  const std::string base = string_attr(record, "base"), want = string_attr(record, "base_checksum");
  if (base.empty()) return;  // the base was drawn from train.seed: the checkpoint holds it whole
  TESSERA_CHECK(std::filesystem::exists(base), "[lora]: checkpoint ", checkpoint, " adapts the base checkpoint ", base,
                ", which no longer exists: a LoRA run resumes with its base (restore the file at that path)");
  const std::string got = "fnv1a64:" + hex(lora_base_checksum(base, comm));
  TESSERA_CHECK(got == want, "[lora]: checkpoint ", checkpoint, " adapts the base checkpoint ", base,
                " whose model tensors had checksum ", want, ", but the file now has ", got,
                ": the base changed since the adapters were trained; restore the original base");
}

std::optional<LoraDropout> lora_dropout_at(const LoraConfig& cfg, int64_t seed, int64_t step, const BatchLayout& layout,
                                           int64_t micro) {
  if (!cfg.enabled() || cfg.dropout == 0.0) return std::nullopt;
  LoraDropout d;
  d.seed = static_cast<uint64_t>(seed);
  d.step = step;
  d.sample0 = layout.dp_rank * (layout.global_batch / layout.dp_size) + micro * layout.micro_batch;
  return d;
}

std::vector<float> lora_merged_weight(const CheckpointReader& reader, const std::string& weight_path, double scale) {
  std::vector<float> w = reader.read_all(weight_path);
  const std::string suffix = ".weight";
  if (weight_path.size() < suffix.size() || weight_path.compare(weight_path.size() - suffix.size(), suffix.size(), suffix))
    return w;
  const std::string layer = weight_path.substr(0, weight_path.size() - suffix.size());
  if (!reader.has(layer + ".lora_A.weight")) return w;
  const Shape ws = reader.shape(weight_path), as = reader.shape(layer + ".lora_A.weight"),
              bs = reader.shape(layer + ".lora_B.weight");
  const int64_t out = ws[0], in = ws[1], r = as[0];
  TESSERA_CHECK(as == (Shape{r, in}) && bs == (Shape{out, r}), reader.path(), ": the adapter of ", weight_path, " ",
                ws.str(), " is A ", as.str(), ", B ", bs.str(), "; expected A (r, ", in, ") and B (", out, ", r)");
  const std::vector<float> a = reader.read_all(layer + ".lora_A.weight"), b = reader.read_all(layer + ".lora_B.weight");
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double sum = 0;
      for (int64_t k = 0; k < r; ++k) sum += double(b[o * r + k]) * double(a[k * in + i]);
      w[o * in + i] = static_cast<float>(double(w[o * in + i]) + scale * sum);
    }
  return w;
}

}  // namespace tessera
