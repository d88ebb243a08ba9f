// The op sets of per-op recomputation by name, per layer, and their check against the block policies.
#include "model/recompute_ops.h"

#include "kernels/check.h"
#include "model/gpt.h"

namespace tessera {

namespace {

// The named ops and sets, in the order recompute_ops_name writes them.
struct NamedOps {
  const char* name;
  RecomputeOps ops;
};
constexpr NamedOps kSingleOps[] = {
    {"norm", {true, false, false, false, false}},   {"qkv", {false, true, false, false, false}},
    {"attn", {false, false, true, false, false}},   {"mlp_in", {false, false, false, true, false}},
    {"mlp_act", {false, false, false, false, true}},
};

RecomputeOps one_name(const std::string& name, const std::string& key) {
  for (const NamedOps& n : kSingleOps)
    if (name == n.name) return n.ops;
  if (name == "selective") return RecomputeOps::selective();
  if (name == "all") return RecomputeOps::all();
  if (name == "none") return {};
  TESSERA_CHECK(false, key, " = \"", name, "\" is not an op; expected norm, qkv, attn, mlp_in, mlp_act, or the "
                "sets selective (= norm + mlp_act), all, none");
  return {};
}

}  // namespace

RecomputeOps operator|(RecomputeOps a, const RecomputeOps& b) {
  a.norm |= b.norm;
  a.qkv |= b.qkv;
  a.attn |= b.attn;
  a.mlp_in |= b.mlp_in;
  a.mlp_act |= b.mlp_act;
  return a;
}

RecomputeOps united(const std::vector<RecomputeOps>& per_layer) {
  RecomputeOps all;
  for (const RecomputeOps& o : per_layer) all = all | o;
  return all;
}

RecomputeOps recompute_ops_of(const std::vector<std::string>& names, const std::string& key) {
  RecomputeOps ops;
  for (size_t i = 0; i < names.size(); ++i) ops = ops | one_name(names[i], key + "[" + std::to_string(i) + "]");
  return ops;
}

RecomputeOps recompute_ops_of(const std::string& joined, const std::string& key) {
  RecomputeOps ops;
  size_t start = 0;
  while (true) {
    const size_t plus = joined.find('+', start);
    ops = ops | one_name(joined.substr(start, plus == std::string::npos ? std::string::npos : plus - start), key);
    if (plus == std::string::npos) return ops;
    start = plus + 1;
  }
}

std::string recompute_ops_name(const RecomputeOps& ops) {
  std::string out;
  for (const NamedOps& n : kSingleOps)
    if ((ops | n.ops) == ops) out += (out.empty() ? "" : "+") + std::string(n.name);
  return out.empty() ? "none" : out;
}

std::vector<RecomputeOps> recompute_ops_policy(const std::vector<std::string>& all,
                                               const std::vector<std::string>& layers, int64_t n_layer) {
  TESSERA_CHECK(layers.empty() || static_cast<int64_t>(layers.size()) == n_layer, "model.recompute_ops_layers has ",
                layers.size(), " entries; expected one per layer (model.n_layer = ", n_layer,
                ") or none ([] = every layer model.recompute_ops)");
  const RecomputeOps every = recompute_ops_of(all, "model.recompute_ops");
  std::vector<RecomputeOps> policy;
  for (int64_t l = 0; l < n_layer; ++l)
    policy.push_back(layers.empty() ? every
                                    : recompute_ops_of(layers[static_cast<size_t>(l)],
                                                       "model.recompute_ops_layers[" + std::to_string(l) + "]"));
  return policy;
}

void check_recompute_ops(const std::vector<RecomputeOps>& ops, const std::vector<Recompute>& recompute) {
  for (size_t l = 0; l < ops.size() && l < recompute.size(); ++l) {
    if (!ops[l].any() || recompute[l] == Recompute::None) continue;
    TESSERA_CHECK(false, "model.recompute_ops = \"", recompute_ops_name(ops[l]), "\" on layer ", l,
                  " chooses what a block that keeps its context recomputes, but the layer already recomputes (",
                  recompute[l] == Recompute::Full ? "full: model.recompute or model.recompute_layers"
                                                  : "selective: model.recompute",
                  "): use model.recompute = \"none\" with model.recompute_ops");
  }
}

}  // namespace tessera
