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

std::string recompute_text(const Layout& l) {
  if (l.recompute_bubble && l.recompute == Recompute::Full) return "bubble";
  if (l.recompute_layers <= 0 || l.recompute == Recompute::Full) return recompute_name(l.recompute);
  return std::string(recompute_name(l.recompute) == std::string("selective") ? "sel" : "none") + "+" +
         std::to_string(l.recompute_layers) + "f";
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
