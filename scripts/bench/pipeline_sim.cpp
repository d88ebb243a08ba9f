// Simulates a pipeline schedule (parallel/pipeline_sim.h): prints its bubble and per-rank numbers,
// and with --json writes the timeline scripts/pipeline_timeline.py draws (docs/parallel.md).
//   build/bench/pipeline_sim --pp 4 --vpp 2 --micro-batches 8 --schedule interleaved --json t.json
//   build/bench/pipeline_sim --pp 4 --micro-batches 8 --schedule zb-h1 --list    (the action lists)
//   build/bench/pipeline_sim --pp 2 --micro-batches 4 --recompute bubble   (none | full | bubble:
//   full recomputation costs a forward more per backward; bubble moves it into R actions)
//   build/bench/pipeline_sim --pp 2 --micro-batches 4 --recompute bubble --recompute-ahead 2
//   (at most 2 recomputed micro-batches held, R's moved into earlier waits; 0: unbounded)
//   build/bench/pipeline_sim --pp 6 --vpp 2 --micro-batches 12 --schedule interleaved --latency 1 \
//     --recompute bubble --recompute-ahead 2 --place-by-costs   (R placed by these costs and latency,
//   never a longer step than each R right before its B: bubble_schedule_for_costs)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/check.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_sim.h"

using namespace tessera;

int main(int argc, char** argv) {
  int64_t pp = 4, vpp = 1, m = 8, ahead = 1;
  std::string kind = "1f1b", json, recompute = "none";
  bool list = false, by_costs = false;
  SimOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--list") {
      list = true;
    } else if (a == "--place-by-costs") {
      by_costs = true;
    } else if (a == "--blocking") {
      o.wait = P2pWait::AtPost;
    } else if (has_value && a == "--pp") {
      pp = std::atoll(argv[++i]);
    } else if (has_value && a == "--vpp") {
      vpp = std::atoll(argv[++i]);
    } else if (has_value && a == "--micro-batches") {
      m = std::atoll(argv[++i]);
    } else if (has_value && a == "--schedule") {
      kind = argv[++i];
    } else if (has_value && a == "--forward") {
      o.forward = std::atof(argv[++i]);
    } else if (has_value && a == "--backward") {
      o.backward = std::atof(argv[++i]);
    } else if (has_value && a == "--weight") {
      o.weight = std::atof(argv[++i]);
    } else if (has_value && a == "--latency") {
      o.latency = std::atof(argv[++i]);
    } else if (has_value && a == "--recompute") {
      recompute = argv[++i];
    } else if (has_value && a == "--recompute-ahead") {
      ahead = std::atoll(argv[++i]);
    } else if (has_value && a == "--json") {
      json = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: pipeline_sim [--pp N] [--vpp N] [--micro-batches N]\n"
                   "         [--schedule gpipe|1f1b|interleaved|zb-h1] [--forward T] [--backward T] [--weight T]\n"
                   "         [--latency T] [--recompute none|full|bubble] [--recompute-ahead K] [--place-by-costs]\n"
                   "         [--blocking] [--list]\n"
                   "         [--json FILE]\n");
      return 2;
    }
  }
  try {
    TESSERA_CHECK(recompute == "none" || recompute == "full" || recompute == "bubble", "--recompute ", recompute,
                  ": expected none, full or bubble");
    o.full_recompute = recompute != "none";
    TESSERA_CHECK(ahead >= 0, "--recompute-ahead ", ahead, ": expected 0 (unbounded) or at least 1");
    TESSERA_CHECK(!by_costs || recompute == "bubble", "--place-by-costs places R actions: it needs --recompute bubble");
    const int64_t K = ahead == 0 ? std::max<int64_t>(1, m * vpp) : ahead;
    const Schedule s = by_costs ? bubble_schedule_for_costs(pp, vpp, m, parse_pipeline_kind(kind), K, o)
                                : pipeline_schedule(pp, vpp, m, parse_pipeline_kind(kind), recompute == "bubble", K);
    const SimResult r = simulate(s, o);
    if (list)
      for (int64_t k = 0; k < s.num_stages(); ++k)
        std::printf("rank %lld: %s\n", (long long)k, to_string(s.actions_of(k)).c_str());
    std::printf("%s pp=%lld vpp=%lld m=%lld f=%g b=%g w=%g latency=%g recompute=%s ahead=%lld%s: makespan %g, bubble %.6f%s\n",
                kind.c_str(), (long long)pp, (long long)vpp, (long long)m, o.forward, o.backward, o.weight, o.latency,
                recompute.c_str(), (long long)ahead, by_costs ? " by costs" : "", r.makespan,
                r.bubble_fraction, r.deadlock ? " DEADLOCK" : "");
    for (const std::string& why : r.stuck) std::printf("  %s\n", why.c_str());
    for (size_t k = 0; k < r.ranks.size(); ++k)
      std::printf("  rank %zu: busy %g idle %g peak activations %lld recomputed held %lld\n", k, r.ranks[k].busy,
                  r.ranks[k].idle, (long long)r.ranks[k].peak_in_flight, (long long)r.ranks[k].peak_recomputed);
    if (!json.empty()) {
      std::ofstream(json) << timeline_json(s, r, kind, o);
      std::printf("wrote %s\n", json.c_str());
    }
    return r.deadlock ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "pipeline_sim: %s\n", e.what());
    return 2;
  }
}
