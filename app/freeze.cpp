// frozen_parameters: glob matching (fnmatch) and the up-scaling record's original layers.
#include "app/freeze.h"

#include <fnmatch.h>

#include "kernels/check.h"
#include "model/upscale.h"

namespace tessera {

std::string string_attr(const AttrMap& attrs, const std::string& key) {
  auto it = attrs.find(key);
  if (it == attrs.end() || !std::holds_alternative<std::string>(it->second)) return "";
  return std::get<std::string>(it->second);
}

std::string freeze_text(const std::vector<std::string>& patterns) {
  std::string out = "[";
  for (size_t i = 0; i < patterns.size(); ++i) out += (i ? ", \"" : "\"") + patterns[i] + "\"";
  return out + "]";
}

std::set<std::string> frozen_parameters(const std::vector<std::string>& patterns, const std::vector<std::string>& names,
                                        int64_t n_layer, const FreezeSource& source, bool apply_original) {
  std::set<std::string> frozen;
  const std::string key = "train.freeze = " + freeze_text(patterns);
  for (const std::string& p : patterns) {
    if (p == kFreezeOriginal) {
      const std::string mapping_text = string_attr(source.record, "mapping");
      TESSERA_CHECK(!mapping_text.empty() || !apply_original, key, ": \"original\" means the layers an up-scaling "
                    "carried over from its source model, but ", source.where, " has no up-scaling record (/upscale); "
                    "resume a checkpoint made by `tessera upscale` or grow in this run ([upscale] method, at_step)");
      if (!apply_original) continue;
      const std::vector<LayerSource> mapping = parse_mapping(mapping_text);
      TESSERA_CHECK(static_cast<int64_t>(mapping.size()) == n_layer, key, ": the up-scaling record of ", source.where,
                    " maps ", mapping.size(), " layers (\"", mapping_text, "\"), but the model has ", n_layer);
      const std::vector<bool> original = original_layers(mapping);
      for (const std::string& name : names) {
        const auto [layer, suffix] = split_block_name(name);
        if (layer < 0 || original.at(static_cast<size_t>(layer))) frozen.insert(name);
      }
      continue;
    }
    size_t matched = 0;
    for (const std::string& name : names)
      if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) frozen.insert(name), ++matched;
    TESSERA_CHECK(matched > 0, key, ": the pattern \"", p, "\" matches no parameter of the model (names are like \"",
                  names.empty() ? "" : names.front(), "\", \"blocks.0.attn.q.weight\"; * ? [...] are globs)");
  }
  TESSERA_CHECK(frozen.size() < names.size() || names.empty(), key, " freezes every one of the model's ", names.size(),
                " parameters: nothing would train");
  return frozen;
}

}  // namespace tessera
