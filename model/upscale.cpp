// Depth up-scaling: the layer mappings (pure index arithmetic) and the tensors of the grown model.
// Optimal-transport fusion permutes only units inside a block (heads with their kv groups, MLP
// hidden units): the residual stream's basis is shared by every layer and stays fixed.
#include "model/upscale.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kernels/check.h"
#include "model/assignment.h"
#include "model/gpt.h"

namespace tessera {

const std::vector<std::string>& upscale_methods() {
  static const std::vector<std::string> methods = {"solar", "stack", "interleave", "expand", "average", "ot"};
  return methods;
}

namespace {

bool inserts(const std::string& m) { return m == "interleave" || m == "expand" || m == "average" || m == "ot"; }

void refuse_option(bool given, const std::string& method, const std::string& option) {
  TESSERA_CHECK(!given, "upscale: --", option, " does not apply to --method ", method, " (",
                method == "solar"   ? "solar takes --overlap or --layers"
                : method == "stack" ? "stack takes --factor or --layers"
                : method == "ot"    ? "ot takes --every or --layers [--position], --sinkhorn-eps and --align-data"
                                    : method + " takes --every or --layers [--position]",
                ")");
}

std::vector<LayerSource> solar(int64_t n, const UpscaleOptions& o) {
  TESSERA_CHECK(!(o.overlap >= 0 && o.layers > 0), "upscale: solar takes --overlap or --layers, not both");
  int64_t m = o.overlap >= 0 ? o.overlap : static_cast<int64_t>(std::lround(static_cast<double>(n) / 4.0));
  if (o.layers > 0) {
    TESSERA_CHECK(o.layers % 2 == 0, "upscale: solar gives an even number of layers, 2 (n - overlap); --layers ",
                  o.layers, " is odd");
    m = n - o.layers / 2;
  }
  TESSERA_CHECK(m >= 0 && m < n, "upscale: solar's overlap must be in [0, ", n - 1, "] for a ", n,
                "-layer source, got ", m, o.layers > 0 ? " (from --layers " + std::to_string(o.layers) + ")" : "");
  TESSERA_CHECK(2 * (n - m) > n, "upscale: solar with overlap ", m, " gives ", 2 * (n - m),
                " layers, not more than the source's ", n, "; the overlap must be below n / 2 = ", n / 2.0);
  std::vector<LayerSource> out;
  for (int64_t i = 0; i < n - m; ++i) out.push_back({LayerInit::Copy, i});
  for (int64_t i = m; i < n; ++i) out.push_back({LayerInit::Copy, i});
  return out;
}

std::vector<LayerSource> stack(int64_t n, const UpscaleOptions& o) {
  TESSERA_CHECK(!(o.factor > 0 && o.layers > 0), "upscale: stack takes --factor or --layers, not both");
  int64_t k = o.factor > 0 ? o.factor : 2;
  if (o.layers > 0) {
    TESSERA_CHECK(o.layers % n == 0, "upscale: stack gives a multiple of the source's ", n, " layers; --layers ",
                  o.layers, " is not one");
    k = o.layers / n;
  }
  TESSERA_CHECK(k >= 2, "upscale: stack needs a factor of at least 2, got ", k);
  std::vector<LayerSource> out;
  for (int64_t r = 0; r < k; ++r)
    for (int64_t i = 0; i < n; ++i) out.push_back({LayerInit::Copy, i});
  return out;
}

// Which of the S insertion slots get a new layer.
std::vector<bool> chosen_slots(int64_t n, int64_t slots, const UpscaleOptions& o) {
  const std::string& m = o.method;
  TESSERA_CHECK(slots >= 1, "upscale: ", m, " inserts layers between neighbours and needs a source of at least 2 "
                "layers, got ", n);
  TESSERA_CHECK(!(o.every > 0 && o.layers > 0), "upscale: ", m, " takes --every or --layers, not both");
  const std::string pos = o.position.empty() ? "uniform" : o.position;
  TESSERA_CHECK(pos == "uniform" || pos == "top" || pos == "bottom", "upscale: --position must be top, bottom or "
                "uniform, got \"", o.position, "\"");
  std::vector<bool> chosen(static_cast<size_t>(slots), false);
  if (o.layers > 0) {
    const int64_t d = o.layers - n;
    TESSERA_CHECK(d >= 1, "upscale: --layers ", o.layers, " is not more than the source's ", n, " layers");
    TESSERA_CHECK(d <= slots, "upscale: ", m, " can give at most ", n + slots, " layers from ", n, " (one new layer ",
                  m == "average" || m == "ot" ? "between each pair of neighbours" : "after each layer",
                  "), got --layers ", o.layers);
    for (int64_t j = 0; j < d; ++j) {
      const int64_t s = pos == "bottom" ? j : pos == "top" ? slots - d + j : (j + 1) * slots / d - 1;
      chosen[static_cast<size_t>(s)] = true;
    }
    return chosen;
  }
  TESSERA_CHECK(pos == "uniform", "upscale: --position ", pos, " needs --layers (how many new layers); --every "
                "places them uniformly");
  const int64_t k = o.every > 0 ? o.every : 1;
  TESSERA_CHECK(k <= slots, "upscale: --every ", k, " inserts nothing: ", m, " has ", slots, " slot",
                slots == 1 ? "" : "s", " in a ", n, "-layer source");
  for (int64_t s = k - 1; s < slots; s += k) chosen[static_cast<size_t>(s)] = true;
  return chosen;
}

std::vector<LayerSource> insert(int64_t n, const UpscaleOptions& o) {
  const bool between = o.method == "average" || o.method == "ot";
  const std::vector<bool> chosen = chosen_slots(n, between ? n - 1 : n, o);
  std::vector<LayerSource> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back({LayerInit::Copy, i});
    if (i >= static_cast<int64_t>(chosen.size()) || !chosen[static_cast<size_t>(i)]) continue;
    if (o.method == "interleave") out.push_back({LayerInit::Copy, i});
    if (o.method == "expand") out.push_back({LayerInit::Expand, i});
    if (o.method == "average") out.push_back({LayerInit::Average, i, i + 1});
    if (o.method == "ot") out.push_back({LayerInit::Fuse, i, i + 1});
  }
  return out;
}

}  // namespace

std::vector<LayerSource> layer_mapping(int64_t n, const UpscaleOptions& o) {
  const auto& all = upscale_methods();
  std::string names;
  for (const auto& m : all) names += (names.empty() ? "" : ", ") + m;
  TESSERA_CHECK(std::find(all.begin(), all.end(), o.method) != all.end(), "upscale: unknown method \"", o.method,
                "\"; the methods are ", names);
  TESSERA_CHECK(n >= 1, "upscale: the source has ", n, " layers");
  TESSERA_CHECK(o.layers >= 0 && o.factor >= 0 && o.every >= 0 && o.overlap >= -1,
                "upscale: --layers, --factor, --every and --overlap take non-negative values");
  TESSERA_CHECK(std::isfinite(o.sinkhorn_eps) && o.sinkhorn_eps >= 0, "upscale: --sinkhorn-eps must be >= 0, got ",
                o.sinkhorn_eps);
  const std::string& m = o.method;
  refuse_option(m != "solar" && o.overlap >= 0, m, "overlap");
  refuse_option(m != "stack" && o.factor > 0, m, "factor");
  refuse_option(!inserts(m) && o.every > 0, m, "every");
  refuse_option(!inserts(m) && !o.position.empty(), m, "position");
  refuse_option(m != "ot" && o.sinkhorn_eps > 0, m, "sinkhorn-eps");
  refuse_option(m != "ot" && o.align_data, m, "align-data");
  TESSERA_CHECK(o.align_batches == 0 || o.align_data, "upscale: --align-batches needs --align-data");
  TESSERA_CHECK(o.align_batches >= 0, "upscale: --align-batches must be >= 1, got ", o.align_batches);
  if (m == "solar") return solar(n, o);
  if (m == "stack") return stack(n, o);
  return insert(n, o);
}

std::string describe_mapping(const std::vector<LayerSource>& mapping) {
  std::ostringstream s;
  for (size_t i = 0; i < mapping.size(); ++i) {
    const LayerSource& l = mapping[i];
    if (i) s << ' ';
    switch (l.init) {
      case LayerInit::Copy: s << l.a; break;
      case LayerInit::Expand: s << "expand(" << l.a << ")"; break;
      case LayerInit::Average: s << "avg(" << l.a << "," << l.b << ")"; break;
      case LayerInit::Fuse: s << "ot(" << l.a << "," << l.b << ")"; break;
    }
  }
  return s.str();
}

std::vector<LayerSource> parse_mapping(const std::string& text) {
  std::istringstream in(text);
  std::vector<LayerSource> out;
  for (std::string tok; in >> tok;) {
    const auto bad = [&] { return "upscale: cannot read layer \"" + tok + "\" of the mapping \"" + text + "\""; };
    LayerSource l;
    const size_t open = tok.find('(');
    try {
      if (open == std::string::npos) {
        TESSERA_CHECK(tok.find_first_not_of("0123456789") == std::string::npos, bad());
        l.a = std::stoll(tok);
      } else {
        TESSERA_CHECK(tok.back() == ')', bad());
        const std::string kind = tok.substr(0, open), args = tok.substr(open + 1, tok.size() - open - 2);
        const size_t comma = args.find(',');
        l.a = std::stoll(args.substr(0, comma));
        if (kind == "expand") {
          TESSERA_CHECK(comma == std::string::npos, bad());
          l.init = LayerInit::Expand;
        } else {
          TESSERA_CHECK((kind == "avg" || kind == "ot") && comma != std::string::npos, bad());
          l.init = kind == "avg" ? LayerInit::Average : LayerInit::Fuse;
          l.b = std::stoll(args.substr(comma + 1));
        }
      }
    } catch (const std::logic_error&) {  // stoll: not a number
      TESSERA_CHECK(false, bad());
    }
    out.push_back(l);
  }
  TESSERA_CHECK(!out.empty(), "upscale: the mapping \"", text, "\" names no layer");
  return out;
}

std::vector<bool> original_layers(const std::vector<LayerSource>& mapping) {
  std::vector<bool> original(mapping.size(), false);
  std::vector<int64_t> seen;
  for (size_t i = 0; i < mapping.size(); ++i) {
    const LayerSource& l = mapping[i];
    if (l.init != LayerInit::Copy || std::find(seen.begin(), seen.end(), l.a) != seen.end()) continue;
    seen.push_back(l.a);
    original[i] = true;
  }
  return original;
}

std::pair<int64_t, std::string> split_block_name(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return {-1, name};
  const size_t dot = name.find('.', 7);
  TESSERA_CHECK(dot != std::string::npos && dot > 7, "upscale: malformed block parameter name ", name);
  const std::string index = name.substr(7, dot - 7);
  TESSERA_CHECK(index.find_first_not_of("0123456789") == std::string::npos, "upscale: malformed block parameter name ",
                name);
  return {std::stoll(index), name.substr(dot + 1)};
}

bool zeroed_by_expand(const std::string& suffix) {
  return suffix == "attn.proj.weight" || suffix == "attn.proj.bias" || suffix == "mlp.proj.weight" ||
         suffix == "mlp.proj.bias" || suffix == "mlp.down.weight";
}

// ---- alignment ----

namespace {

// Which units a block tensor is laid out by, and along which axis.
enum class Units { None, Heads, KvHeads, Mlp };
struct UnitAxis {
  Units units = Units::None;
  bool columns = false;  // units along the columns (output projections) rather than the rows
};

UnitAxis unit_axis(const std::string& suffix) {
  if (suffix == "attn.q.weight" || suffix == "attn.q.bias") return {Units::Heads, false};
  if (suffix == "attn.k.weight" || suffix == "attn.k.bias" || suffix == "attn.v.weight" || suffix == "attn.v.bias")
    return {Units::KvHeads, false};
  if (suffix == "attn.proj.weight") return {Units::Heads, true};
  if (suffix == "mlp.fc.weight" || suffix == "mlp.fc.bias" || suffix == "mlp.gate.weight" || suffix == "mlp.up.weight")
    return {Units::Mlp, false};
  if (suffix == "mlp.proj.weight" || suffix == "mlp.down.weight") return {Units::Mlp, true};
  return {};
}

// Units of that kind and the width of one unit along the axis (D for heads, 1 for MLP units).
std::pair<int64_t, int64_t> unit_count(const ModelConfig& cfg, Units u) {
  switch (u) {
    case Units::Heads: return {cfg.n_head, cfg.head_dim()};
    case Units::KvHeads: return {cfg.kv_heads(), cfg.head_dim()};
    case Units::Mlp: return {cfg.ffn_hidden, 1};
    case Units::None: break;
  }
  return {1, 1};
}

// The tensor as (rows, cols) with units along one axis: rows = numel / cols.
struct UnitView {
  int64_t rows, cols, n, width;
  bool columns;
};

UnitView view_of(const ModelConfig& cfg, const std::string& suffix, int64_t numel) {
  const UnitAxis ax = unit_axis(suffix);
  const auto [n, width] = unit_count(cfg, ax.units);
  UnitView v{0, 0, n, width, ax.columns};
  v.cols = ax.columns ? n * width : (numel / (n * width));
  v.rows = numel / v.cols;
  TESSERA_CHECK(v.rows * v.cols == numel && (ax.columns ? v.cols : v.rows) == n * width, "upscale: ", suffix,
                " has ", numel, " elements, which do not hold ", n, " units of width ", width);
  return v;
}

// Unit u's elements of tensor x, appended to out.
void append_unit(const std::vector<float>& x, const UnitView& v, int64_t u, std::vector<float>& out) {
  if (!v.columns) {
    const auto first = x.begin() + u * v.width * v.cols;
    out.insert(out.end(), first, first + v.width * v.cols);
  } else {
    for (int64_t r = 0; r < v.rows; ++r) {
      const auto first = x.begin() + r * v.cols + u * v.width;
      out.insert(out.end(), first, first + v.width);
    }
  }
}

// Per unit, its elements of every listed tensor of one block: (n, dim) row-major.
std::vector<float> unit_features(const ModelConfig& cfg, const TensorFetch& fetch,
                                 const std::vector<std::string>& suffixes, int64_t n) {
  std::vector<std::vector<float>> per_unit(static_cast<size_t>(n));
  for (const std::string& s : suffixes) {
    const std::vector<float> x = fetch(s);
    const UnitView v = view_of(cfg, s, static_cast<int64_t>(x.size()));
    for (int64_t u = 0; u < n; ++u) append_unit(x, v, u, per_unit[static_cast<size_t>(u)]);
  }
  std::vector<float> out;
  for (auto& f : per_unit) out.insert(out.end(), f.begin(), f.end());
  return out;
}

// cost[i n + j] = squared distance between row i of a and row j of b, both (n, dim).
std::vector<double> squared_distances(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  const int64_t dim = n > 0 ? static_cast<int64_t>(a.size()) / n : 0;
  std::vector<double> cost(static_cast<size_t>(n * n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float* x = a.data() + i * dim;
      const float* y = b.data() + j * dim;
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < dim; ++k) {
        const double d = static_cast<double>(x[k]) - static_cast<double>(y[k]);
        s += d * d;
      }
      cost[static_cast<size_t>(i * n + j)] = s;
    }
  return cost;
}

std::vector<std::string> present(const ModelConfig& cfg, std::vector<std::string> weights,
                                 const std::vector<std::string>& biases) {
  if (cfg.bias) weights.insert(weights.end(), biases.begin(), biases.end());
  return weights;
}

// Rows [first, first + count) of an (n, dim) feature matrix.
std::vector<float> rows_of(const std::vector<float>& f, int64_t n, int64_t first, int64_t count) {
  const int64_t dim = static_cast<int64_t>(f.size()) / n;
  return {f.begin() + first * dim, f.begin() + (first + count) * dim};
}

void align_heads(const ModelConfig& cfg, const UnitFeatures& fa, const UnitFeatures& fb, BlockAlignment& al) {
  const int64_t H = cfg.n_head, KV = cfg.kv_heads(), r = H / KV;
  const std::vector<float>&qa = fa.heads, &qb = fb.heads;
  const std::vector<double> kv_cost = fa.kv_heads.empty() || fb.kv_heads.empty()
                                          ? std::vector<double>(static_cast<size_t>(KV * KV), 0.0)
                                          : squared_distances(fa.kv_heads, fb.kv_heads, KV);
  // Group pair (g, h): k/v distance plus the best matching of the groups' r query heads.
  std::vector<double> group_cost(static_cast<size_t>(KV * KV));
  std::vector<std::vector<int64_t>> inner(static_cast<size_t>(KV * KV));
  for (int64_t g = 0; g < KV; ++g)
    for (int64_t h = 0; h < KV; ++h) {
      const std::vector<double> c = squared_distances(rows_of(qa, H, g * r, r), rows_of(qb, H, h * r, r), r);
      auto& p = inner[static_cast<size_t>(g * KV + h)];
      p = solve_assignment(c, r);
      double total = kv_cost[static_cast<size_t>(g * KV + h)];
      for (int64_t j = 0; j < r; ++j) total += c[static_cast<size_t>(j * r + p[static_cast<size_t>(j)])];
      group_cost[static_cast<size_t>(g * KV + h)] = total;
    }
  al.kv_heads = solve_assignment(group_cost, KV);
  al.heads.assign(static_cast<size_t>(H), 0);
  for (int64_t g = 0; g < KV; ++g) {
    const int64_t h = al.kv_heads[static_cast<size_t>(g)];
    const auto& p = inner[static_cast<size_t>(g * KV + h)];
    for (int64_t j = 0; j < r; ++j) al.heads[static_cast<size_t>(g * r + j)] = h * r + p[static_cast<size_t>(j)];
  }
}

void align_mlp(const ModelConfig& cfg, const UnitFeatures& fa, const UnitFeatures& fb, double eps, BlockAlignment& al) {
  const int64_t F = cfg.ffn_hidden;
  const std::vector<double> cost = squared_distances(fa.mlp, fb.mlp, F);
  if (eps > 0) {
    al.plan = sinkhorn_plan(cost, F, eps);
  } else {
    al.units = solve_assignment(cost, F);
  }
}

// Per unit, the features of a (tokens, n, width) activation tensor: unit u's `width` values at
// every token, appended to acc[u].
void append_activations(const Tensor& t, int64_t n, std::vector<std::vector<float>>& acc) {
  const float* x = t.ptr<float>();
  const int64_t width = t.numel() / t.shape[0] / t.shape[1] / n, tokens = t.shape[0] * t.shape[1];
  acc.resize(static_cast<size_t>(n));
  for (int64_t k = 0; k < tokens; ++k)
    for (int64_t u = 0; u < n; ++u) {
      const float* first = x + (k * n + u) * width;
      acc[static_cast<size_t>(u)].insert(acc[static_cast<size_t>(u)].end(), first, first + width);
    }
}

std::vector<float> flatten(const std::vector<std::vector<float>>& per_unit) {
  std::vector<float> out;
  for (const auto& f : per_unit) out.insert(out.end(), f.begin(), f.end());
  return out;
}

struct FeatureAcc {
  std::vector<std::vector<float>> heads, kv, mlp;
  void add(const ModelConfig& cfg, const BlockCtx& c) {
    append_activations(c.attn.q.tensor(), cfg.n_head, heads);
    append_activations(c.attn.out.tensor(), cfg.n_head, heads);
    append_activations(c.attn.k.tensor(), cfg.kv_heads(), kv);
    append_activations(c.attn.v.tensor(), cfg.kv_heads(), kv);
    append_activations(c.mlp.act.tensor(), cfg.ffn_hidden, mlp);
  }
  UnitFeatures features() const { return {flatten(heads), flatten(kv), flatten(mlp)}; }
};

}  // namespace

UnitFeatures weight_features(const ModelConfig& cfg, const TensorFetch& fetch) {
  const auto q_names = present(cfg, {"attn.q.weight", "attn.proj.weight"}, {"attn.q.bias"});
  const auto kv_names = present(cfg, {"attn.k.weight", "attn.v.weight"}, {"attn.k.bias", "attn.v.bias"});
  const auto mlp_names = cfg.mlp == MlpKind::Gelu ? present(cfg, {"mlp.fc.weight", "mlp.proj.weight"}, {"mlp.fc.bias"})
                                                  : std::vector<std::string>{"mlp.gate.weight", "mlp.up.weight",
                                                                             "mlp.down.weight"};
  return {unit_features(cfg, fetch, q_names, cfg.n_head), unit_features(cfg, fetch, kv_names, cfg.kv_heads()),
          unit_features(cfg, fetch, mlp_names, cfg.ffn_hidden)};
}

BlockAlignment align_features(const ModelConfig& cfg, const UnitFeatures& a, const UnitFeatures& b, double eps) {
  TESSERA_CHECK(a.heads.size() == b.heads.size() && a.mlp.size() == b.mlp.size() && a.kv_heads.size() == b.kv_heads.size(),
                "upscale: the two blocks' unit features differ in size");
  BlockAlignment al;
  align_heads(cfg, a, b, al);
  align_mlp(cfg, a, b, eps, al);
  return al;
}

BlockAlignment align_blocks(const ModelConfig& cfg, const TensorFetch& a, const TensorFetch& b, double eps) {
  return align_features(cfg, weight_features(cfg, a), weight_features(cfg, b), eps);
}

std::map<int64_t, std::pair<UnitFeatures, UnitFeatures>> activation_features(
    const ModelConfig& cfg, const TensorFetch& params, const std::vector<LayerSource>& mapping,
    const std::vector<std::vector<int32_t>>& batches, int64_t B, int64_t T) {
  Allocator alloc;
  const Exec ex = Exec::cpu();
  ParameterStore ps(alloc, DType::F32);
  const Gpt model(cfg, ps);
  ps.finalize();
  for (int id = 0; id < ps.size(); ++id) {
    const std::vector<float> v = params(ps.entry(id).spec.name);
    const Tensor t = ps.param(id);
    TESSERA_CHECK(static_cast<int64_t>(v.size()) == t.numel(), "upscale --align-data: ", ps.entry(id).spec.name,
                  " has ", v.size(), " elements, the model's ", t.numel());
    std::copy(v.begin(), v.end(), t.ptr<float>());
  }
  std::map<int64_t, std::pair<FeatureAcc, FeatureAcc>> acc;
  const SequenceLayout seq = SequenceLayout::contiguous(T);
  for (const std::vector<int32_t>& ids : batches) {
    TESSERA_CHECK(static_cast<int64_t>(ids.size()) == B * T, "upscale --align-data: a batch of ", ids.size(),
                  " tokens, expected ", B, " x ", T);
    GptCtx ctx;
    model.forward(ex, ctx, alloc, Tensor(const_cast<int32_t*>(ids.data()), DType::I32, {B, T}), Tensor(), seq);
    for (size_t i = 0; i < mapping.size(); ++i) {
      const LayerSource& l = mapping[i];
      if (l.init != LayerInit::Fuse) continue;
      auto& [fa, fb] = acc[static_cast<int64_t>(i)];
      fa.add(cfg, ctx.blocks.at(static_cast<size_t>(l.a)));
      // Block b on block a's input: both blocks judged on the same tokens and residual stream.
      BlockCtx cb;
      const Buffer y(alloc, DType::F32, {B, T, cfg.n_embd}, MemCategory::Activations);
      model.block(l.b).forward(ex, cb, alloc, y, ctx.resid.at(static_cast<size_t>(l.a)), seq);
      fb.add(cfg, cb);
    }
  }
  std::map<int64_t, std::pair<UnitFeatures, UnitFeatures>> out;
  for (const auto& [layer, pair] : acc) out[layer] = {pair.first.features(), pair.second.features()};
  return out;
}

std::vector<float> apply_alignment(const ModelConfig& cfg, const BlockAlignment& al, const std::string& suffix,
                                   const std::vector<float>& x) {
  const UnitAxis ax = unit_axis(suffix);
  if (ax.units == Units::None) return x;  // in the residual stream's basis
  const UnitView v = view_of(cfg, suffix, static_cast<int64_t>(x.size()));
  std::vector<float> out(x.size());
  // Element k of row r of unit `unit` (a unit spans `width` rows, or `width` columns of every row).
  auto idx = [&](int64_t unit, int64_t r, int64_t k) {
    return static_cast<size_t>(v.columns ? r * v.cols + unit * v.width + k : (unit * v.width + r) * v.cols + k);
  };
  const int64_t outer = v.columns ? v.rows : v.width, inner = v.columns ? v.width : v.cols;
  if (ax.units == Units::Mlp && !al.plan.empty()) {
    const int64_t F = v.n;
    for (int64_t u = 0; u < F; ++u)
      for (int64_t r = 0; r < outer; ++r)
        for (int64_t k = 0; k < inner; ++k) {
          double s = 0.0;
          for (int64_t w = 0; w < F; ++w) s += al.plan[static_cast<size_t>(u * F + w)] * x[idx(w, r, k)];
          out[idx(u, r, k)] = static_cast<float>(static_cast<double>(F) * s);
        }
    return out;
  }
  const std::vector<int64_t>& perm =
      ax.units == Units::Heads ? al.heads : ax.units == Units::KvHeads ? al.kv_heads : al.units;
  TESSERA_CHECK(static_cast<int64_t>(perm.size()) == v.n, "upscale: the alignment has ", perm.size(), " units for ",
                suffix, ", which has ", v.n);
  for (int64_t u = 0; u < v.n; ++u)
    for (int64_t r = 0; r < outer; ++r)
      for (int64_t k = 0; k < inner; ++k) out[idx(u, r, k)] = x[idx(perm[static_cast<size_t>(u)], r, k)];
  return out;
}

// ---- the grown model's tensors ----

LayerUpscaler::LayerUpscaler(const ModelConfig& source, const UpscaleOptions& options)
    : LayerUpscaler(source, layer_mapping(source.n_layer, options), options.sinkhorn_eps) {}

LayerUpscaler::LayerUpscaler(const ModelConfig& source, std::vector<LayerSource> mapping, double sinkhorn_eps)
    : source_(source), target_(source), mapping_(std::move(mapping)), sinkhorn_eps_(sinkhorn_eps) {
  TESSERA_CHECK(!mapping_.empty(), "upscale: the layer mapping is empty");
  for (const LayerSource& l : mapping_) {
    const bool two = l.init == LayerInit::Average || l.init == LayerInit::Fuse;
    TESSERA_CHECK(l.a >= 0 && l.a < source_.n_layer && (!two || (l.b >= 0 && l.b < source_.n_layer)),
                  "upscale: the mapping names a layer outside the source's ", source_.n_layer, ": ",
                  describe_mapping({l}));
  }
  target_.n_layer = static_cast<int64_t>(mapping_.size());
}

std::vector<float> LayerUpscaler::parameter(const std::string& name, const TensorFetch& params) {
  return produce(name, params, params);
}

std::vector<float> LayerUpscaler::moment(const std::string& name, const TensorFetch& params, const TensorFetch& m) {
  return produce(name, params, m);
}

const BlockAlignment& LayerUpscaler::alignment(int64_t layer, const TensorFetch& params) {
  auto it = alignments_.find(layer);
  if (it != alignments_.end()) return it->second;
  const LayerSource& l = mapping_[static_cast<size_t>(layer)];
  auto of = [&](int64_t src) {
    return [&params, src](const std::string& suffix) { return params("blocks." + std::to_string(src) + "." + suffix); };
  };
  if (auto f = features_.find(layer); f != features_.end())
    return alignments_.emplace(layer, align_features(source_, f->second.first, f->second.second, sinkhorn_eps_))
        .first->second;
  return alignments_.emplace(layer, align_blocks(source_, of(l.a), of(l.b), sinkhorn_eps_)).first->second;
}

std::vector<float> LayerUpscaler::produce(const std::string& name, const TensorFetch& params,
                                          const TensorFetch& values) {
  const auto [layer, suffix] = split_block_name(name);
  if (layer < 0) return values(name);
  TESSERA_CHECK(layer < target_.n_layer, "upscale: ", name, " is past the grown model's ", target_.n_layer, " layers");
  const LayerSource& l = mapping_[static_cast<size_t>(layer)];
  auto src = [&, suffix = suffix](int64_t i) { return values("blocks." + std::to_string(i) + "." + suffix); };  // clang 14 cannot capture a structured binding
  switch (l.init) {
    case LayerInit::Copy: return src(l.a);
    case LayerInit::Expand: {
      std::vector<float> x = src(l.a);
      if (zeroed_by_expand(suffix)) std::fill(x.begin(), x.end(), 0.0f);
      return x;
    }
    case LayerInit::Average:
    case LayerInit::Fuse: {
      std::vector<float> x = src(l.a), y = src(l.b);
      if (l.init == LayerInit::Fuse) y = apply_alignment(source_, alignment(layer, params), suffix, y);
      TESSERA_CHECK(x.size() == y.size(), "upscale: ", suffix, " differs in size between layers ", l.a, " and ", l.b);
      for (size_t i = 0; i < x.size(); ++i) x[i] = (x[i] + y[i]) * 0.5f;
      return x;
    }
  }
  return {};
}

}  // namespace tessera
