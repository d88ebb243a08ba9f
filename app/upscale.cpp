// `tessera upscale`: read the source's stored config and tensors, map its layers (model/upscale.h),
// and stream the grown tensors into a new checkpoint whose /meta keeps the step, tokens and data
// position (so no sample is seen twice), with a fresh run id and an /upscale record.
#include "app/upscale.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/checkpoint_plan.h"
#include "app/checkpoint/checkpointing.h"
#include "app/checkpoint/hf_export.h"
#include "app/config.h"
#include "app/training_data.h"
#include "data/loader.h"
#include "kernels/check.h"
#include "parallel/mpi.h"

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
  if (o.align_data) s << " --align-data";
  if (o.align_batches > 0) s << " --align-batches " << o.align_batches;
  if (carry) s << " --carry-optimizer";
  const std::string t = s.str();
  return t.empty() ? "" : t.substr(1);
}

const std::string kModel = "/model/", kOptim = "/optim/";

}  // namespace

namespace {
// Entry e's global tensor viewed as (outer, G, inner) along its shard dim: G = the global extent.
struct ShardView {
  int64_t outer = 1, global = 1, inner = 1, local = 1;
};
ShardView shard_view(const ParamEntry& e) {
  ShardView v;
  if (!e.sharded()) {
    v.global = v.local = e.spec.global_shape.numel();
    return v;
  }
  const int d = e.spec.shard.dim;
  const Shape& g = e.spec.global_shape;
  for (int i = 0; i < d; ++i) v.outer *= g[i];
  for (int i = d + 1; i < g.ndim(); ++i) v.inner *= g[i];
  v.global = g[d];
  v.local = e.local_shape[d];
  return v;
}
}  // namespace

GlobalTensors gather_global_tensors(const ParameterStore& ps, const std::function<const float*(const ParamEntry&)>& values,
                                    bool contributes, bool contributes_whole, MPI_Comm comm) {
  ckpt::ByteWriter mine;
  std::vector<const ParamEntry*> sent;
  if (contributes)
    for (const ParamEntry& e : ps.entries())
      if (!e.spec.stage_copy && (e.sharded() || contributes_whole) && values(e)) sent.push_back(&e);
  mine.i64(static_cast<int64_t>(sent.size()));
  for (const ParamEntry* e : sent) {
    const ShardView v = shard_view(*e);
    const int64_t valid = e->sharded() ? e->shard_valid : v.global;
    mine.str(e->spec.name);
    mine.shape(e->spec.global_shape);
    mine.i64(e->sharded() ? e->spec.shard.dim : -1);
    mine.i64(e->sharded() ? e->shard_start : 0);
    mine.i64(valid);
    // The stored rows only: (outer, valid, inner) of the local (outer, local, inner).
    std::string data(static_cast<size_t>(v.outer * valid * v.inner) * sizeof(float), '\0');
    const float* src = values(*e);
    for (int64_t o = 0; o < v.outer; ++o)
      std::memcpy(data.data() + static_cast<size_t>(o * valid * v.inner) * sizeof(float), src + o * v.local * v.inner,
                  static_cast<size_t>(valid * v.inner) * sizeof(float));
    mine.str(data);
  }
  const std::vector<std::string> all =
      comm == MPI_COMM_NULL ? std::vector<std::string>{mine.bytes()} : allgather_bytes(comm, mine.bytes());
  GlobalTensors out;
  for (const std::string& bytes : all) {
    ckpt::ByteReader in(bytes);
    for (int64_t n = in.i64(); n > 0; --n) {
      const std::string name = in.str();
      const Shape shape = in.shape();
      const int64_t dim = in.i64(), start = in.i64(), valid = in.i64();
      const std::string data = in.str();
      int64_t outer = 1, inner = 1, global = shape.numel();
      if (dim >= 0) {
        for (int i = 0; i < dim; ++i) outer *= shape[i];
        for (int i = static_cast<int>(dim) + 1; i < shape.ndim(); ++i) inner *= shape[i];
        global = shape[dim];
      }
      TESSERA_CHECK(static_cast<int64_t>(data.size()) == outer * valid * inner * 4 && start + valid <= global,
                    "gather_global_tensors: ", name, " arrived with ", data.size(), " bytes");
      std::vector<float>& t = out[name];
      t.resize(static_cast<size_t>(shape.numel()));
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(t.data() + (o * global + start) * inner, data.data() + static_cast<size_t>(o * valid * inner) * 4,
                    static_cast<size_t>(valid * inner) * 4);
    }
  }
  return out;
}

void copy_local_part(const ParamEntry& e, const std::vector<float>& global, float* out) {
  const ShardView v = shard_view(e);
  TESSERA_CHECK(static_cast<int64_t>(global.size()) == e.spec.global_shape.numel(), "upscale: ", e.spec.name, " has ",
                global.size(), " elements, the model's ", e.spec.global_shape.numel());
  const int64_t start = e.sharded() ? e.shard_start : 0, valid = e.sharded() ? e.shard_valid : v.global;
  std::fill(out, out + e.local_shape.numel(), 0.0f);  // padding rows stay zero
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(out + o * v.local * v.inner, global.data() + (o * v.global + start) * v.inner,
                static_cast<size_t>(valid * v.inner) * sizeof(float));
}

std::vector<std::vector<int32_t>> alignment_batches(const Config& c, const TrainingData& data, int64_t n, int64_t& B,
                                                   int64_t& T) {
  const Dataset& ds = data.valid ? *data.valid : *data.train;
  B = c.train.micro_batch > 0 ? c.train.micro_batch : 4;
  T = c.train.seq_len;
  const Sampler sampler(ds.num_samples(), static_cast<uint64_t>(c.train.seed));
  DataLoader loader(ds, sampler, BatchLayout{B, B, 1, 0}, 0);
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(loader.next().tokens);
  return out;
}

UpscaleOptions upscale_options(const UpscaleConfig& c) {
  UpscaleOptions o;
  o.method = c.method;
  o.layers = c.layers;
  o.factor = c.factor;
  o.overlap = c.overlap;
  o.every = c.every;
  o.position = c.position;
  o.sinkhorn_eps = c.sinkhorn_eps;
  o.align_data = c.align_data > 0;
  o.align_batches = c.align_data;
  return o;
}

std::string grown_config_toml(const std::string& source_toml, const std::string& source_name, int64_t layers) {
  Config c = parse_config_string(source_toml, source_name);
  c.model.n_layer = layers;
  c.parallel.pp_layers.clear();
  validate(c);
  return to_toml(c);
}

int run_upscale_command(const UpscaleArgs& args, std::ostream& out) {
  CheckpointReader reader(args.from, MPI_COMM_SELF);
  require_text_model(reader, "tessera upscale");
  const ModelConfig source = model_config_of(reader);
  check_shapes(reader, model_tensor_shapes(source));  // the tensors are the stored config's model
  LayerUpscaler up(source, args.options);
  const std::vector<LayerSource>& mapping = up.mapping();
  const std::string config = grown_config_toml(reader.meta().config_toml, args.from + ":/meta/config",
                                               up.target().n_layer);

  const TensorFetch params = [&](const std::string& name) { return reader.read_all(kModel + name); };
  if (args.options.align_data) {
    int64_t B = 0, T = 0;
    const Config stored = parse_config_string(reader.meta().config_toml, args.from + ":/meta/config");
    const auto batches = alignment_batches(stored, open_training_data(stored),
                                           args.options.align_batches > 0 ? args.options.align_batches : 4, B, T);
    up.set_features(activation_features(source, params, mapping, batches, B, T));
  }
  // A parameter the source run froze (listed in /optim@frozen) has no moments: zero, as fresh ones.
  const GroupAttributes& source_groups = reader.group_attributes();
  std::string frozen_names;
  if (auto g = source_groups.find("/optim"); g != source_groups.end())
    if (auto f = g->second.find(kFrozenKey); f != g->second.end() && std::holds_alternative<std::string>(f->second))
      frozen_names = " " + std::get<std::string>(f->second) + " ";
  auto moment_of = [&](const std::string& kind) -> TensorFetch {
    return [&reader, &params, &frozen_names, kind](const std::string& name) {
      const std::string path = kOptim + name + "/" + kind;
      if (!reader.has(path) && frozen_names.find(" " + name + " ") != std::string::npos)
        return std::vector<float>(params(name).size(), 0.0f);
      return reader.read_all(path);
    };
  };
  bool any_moments = false;
  for (const TensorInfo& t : reader.tensors()) any_moments |= t.path.rfind(kOptim, 0) == 0;
  TESSERA_CHECK(!args.carry_optimizer || any_moments, "upscale --carry-optimizer: ", args.from,
                " holds no optimizer moments (nothing under /optim/)");
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
  groups["/optim"].erase(kFrozenKey);  // the grown file holds every parameter's moments
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
