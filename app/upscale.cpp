// `tessera upscale`: read the source's stored config and tensors, map its layers (model/upscale.h),
// and stream the grown tensors into a new checkpoint whose /meta keeps the step, tokens and data
// position (so no sample is seen twice), with a fresh run id and an /upscale record.
#include "app/upscale.h"

#include <mpi.h>

#include <map>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/checkpointing.h"
#include "app/checkpoint/hf_export.h"
#include "app/config.h"
#include "kernels/check.h"

namespace tessera {

namespace {

std::string options_text(const UpscaleOptions& o, bool carry) {
  std::ostringstream s;
  if (o.layers > 0) s << " --layers " << o.layers;
  if (o.factor > 0) s << " --factor " << o.factor;
  if (o.overlap >= 0) s << " --overlap " << o.overlap;
  if (o.every > 0) s << " --every " << o.every;
  if (!o.position.empty()) s << " --position " << o.position;
  if (o.sinkhorn_eps > 0) s << " --sinkhorn-eps " << o.sinkhorn_eps;
  if (carry) s << " --carry-optimizer";
  const std::string t = s.str();
  return t.empty() ? "" : t.substr(1);
}

const std::string kModel = "/model/", kOptim = "/optim/";

}  // namespace

std::string grown_config_toml(const std::string& source_toml, const std::string& source_name, int64_t layers) {
  Config c = parse_config_string(source_toml, source_name);
  c.model.n_layer = layers;
  c.parallel.pp_layers.clear();
  validate(c);
  return to_toml(c);
}

int run_upscale_command(const UpscaleArgs& args, std::ostream& out) {
  CheckpointReader reader(args.from, MPI_COMM_SELF);
  const ModelConfig source = model_config_of(reader);
  check_shapes(reader, model_tensor_shapes(source));  // the tensors are the stored config's model
  LayerUpscaler up(source, args.options);
  const std::vector<LayerSource>& mapping = up.mapping();
  const std::string config = grown_config_toml(reader.meta().config_toml, args.from + ":/meta/config",
                                               up.target().n_layer);

  const TensorFetch params = [&](const std::string& name) { return reader.read_all(kModel + name); };
  auto moment_of = [&](const std::string& kind) -> TensorFetch {
    return [&reader, kind](const std::string& name) { return reader.read_all(kOptim + name + "/" + kind); };
  };
  TESSERA_CHECK(!args.carry_optimizer || reader.has(kOptim + "wte.weight/exp_avg"), "upscale --carry-optimizer: ",
                args.from, " holds no optimizer moments (/optim/wte.weight/exp_avg is missing)");
  struct Made {
    std::string param, kind;  // kind: "" for the parameter, else the moment ("exp_avg", "exp_avg_sq")
    int64_t numel;
  };
  std::vector<std::pair<std::string, Shape>> tensors;
  std::map<std::string, Made> made;  // by file path
  for (const auto& [path, shape] : model_tensor_shapes(up.target())) {
    const std::string name = path.substr(kModel.size());
    tensors.emplace_back(path, shape);
    made[path] = {name, "", shape.numel()};
    for (const std::string kind : {"exp_avg", "exp_avg_sq"}) {
      tensors.emplace_back(kOptim + name + "/" + kind, shape);
      made[tensors.back().first] = {name, kind, shape.numel()};
    }
  }
  const TensorProducer produce = [&](const std::string& path) -> std::vector<float> {
    const Made& m = made.at(path);
    if (m.kind.empty()) return up.parameter(m.param, params);
    if (args.carry_optimizer) return up.moment(m.param, params, moment_of(m.kind));
    return std::vector<float>(static_cast<size_t>(m.numel), 0.0f);  // fresh moments
  };

  CheckpointMeta meta = reader.meta();  // step, tokens seen, consumed samples: the data position carries on
  meta.format_version = kCheckpointFormatVersion;
  meta.tessera_version = TESSERA_VERSION;
  meta.config_toml = config;
  meta.extra[kRunIdKey] = new_run_id();  // another model: a run of its own
  GroupAttributes groups = reader.group_attributes();
  groups.erase(kUpscaleGroup);  // a grown checkpoint grown again records the last growth
  if (!args.carry_optimizer) groups["/optim"]["step"] = int64_t{0};  // AdamW's bias corrections restart
  AttrMap& rec = groups[kUpscaleGroup];
  rec["method"] = args.options.method;
  rec["options"] = options_text(args.options, args.carry_optimizer);
  rec["source_file"] = args.from;
  rec["source_step"] = reader.meta().step;
  rec["source_layers"] = source.n_layer;
  rec["layers"] = up.target().n_layer;
  rec["mapping"] = describe_mapping(mapping);
  write_checkpoint_file_streamed(args.out, meta, tensors, produce, groups);

  out << "grew " << args.from << " (" << source.preset << ", " << source.n_layer << " layers, step " << meta.step
      << ") by " << args.options.method << " to " << up.target().n_layer << " layers: " << describe_mapping(mapping)
      << "\nwrote " << args.out << " (optimizer moments " << (args.carry_optimizer ? "carried" : "fresh")
      << ", data position carried)\n";
  return 0;
}

}  // namespace tessera
