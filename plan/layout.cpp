// Layout names for messages and the table (plan/layout.h).
#include "plan/layout.h"

namespace tessera::plan {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "none";
}

namespace {

// An op set by its ops' letters: "nm" for norm+mlp_act.
std::string ops_letters(const RecomputeOps& o) {
  std::string s;
  if (o.norm) s += 'n';
  if (o.qkv) s += 'q';
  if (o.attn) s += 'a';
  if (o.mlp_in) s += 'i';
  if (o.mlp_act) s += 'm';
  return s;
}

// The runs of equal op sets over a chunk's blocks from `from` on, until the last that recomputes
// some: "+3nim+2n".
std::string ops_runs(const Layout& l, int64_t from) {
  int64_t last = from - 1;
  for (int64_t i = from; i < int64_t(l.recompute_ops.size()); ++i)
    if (chunk_block_ops(l, i).any()) last = i;
  std::string s;
  for (int64_t i = from; i <= last;) {
    const RecomputeOps o = chunk_block_ops(l, i);
    int64_t n = 0;
    while (i <= last && chunk_block_ops(l, i) == o) ++i, ++n;
    s += "+" + std::to_string(n) + (o.any() ? ops_letters(o) : "none");
  }
  return s;
}

}  // namespace

RecomputeOps chunk_block_ops(const Layout& l, int64_t position) {
  if (l.recompute != Recompute::None || position < l.recompute_layers || position < 0 ||
      position >= int64_t(l.recompute_ops.size()))
    return {};
  return l.recompute_ops[size_t(position)];
}

std::vector<std::string> recompute_ops_layers(const Layout& l, const std::vector<StageSpec>& cut, int64_t n_layer) {
  std::vector<StageSpec> chunks = cut;
  if (chunks.empty()) chunks.push_back(StageSpec{0, n_layer, true, true});
  std::vector<std::string> names;
  bool any = false;
  for (const StageSpec& s : chunks) {
    const int64_t end = s.end_layer < 0 ? n_layer : s.end_layer;
    for (int64_t i = 0; i < end - s.first_layer; ++i) {
      const RecomputeOps o = chunk_block_ops(l, i);
      any |= o.any();
      names.push_back(recompute_ops_name(o));
    }
  }
  if (!any) return {};
  return names;
}

std::string recompute_text(const Layout& l) {
  if (l.recompute_bubble && l.recompute == Recompute::Full)
    return l.recompute_ahead > 1 ? "bubble+" + std::to_string(l.recompute_ahead) + "a" : "bubble";
  const std::string ops = ops_runs(l, l.recompute_layers);
  if (l.recompute == Recompute::Full || (l.recompute_layers <= 0 && ops.empty())) return recompute_name(l.recompute);
  std::string s = recompute_name(l.recompute) == std::string("selective") ? "sel" : "none";
  if (l.recompute_layers > 0) s += "+" + std::to_string(l.recompute_layers) + "f";
  return s + ops;
}

std::string describe(const Layout& l) {
  std::string s = "dp " + std::to_string(l.dp) + " tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) +
                  " vpp " + std::to_string(l.vpp) + " cp " + std::to_string(l.cp);
  s += l.sp ? " sp" : "";
  s += " zero " + std::to_string(l.zero) + " " + std::string(pipeline_kind_name(l.schedule));
  if (l.cp > 1) s += l.cp_ring ? " ring" : " allgather";
  s += " mb " + std::to_string(l.micro_batch) + " " + recompute_text(l) + (l.bf16 ? " bf16" : " fp32");
  return s;
}

}  // namespace tessera::plan
