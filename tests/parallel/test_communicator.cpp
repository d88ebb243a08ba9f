// Tests parallel/communicator.h, mpi_communicator.h and grid_comms.h: every op against values
// computed from the rank numbers, async overlap, batched point-to-point, handles ordered on an
// Exec, grid sub-communicators, byte counters, error agreement. Runs as one rank
// under ctest and again under mpiexec with 1, 2 and 4 ranks (tests/CMakeLists.txt).
#include "parallel/communicator.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "error_testing.h"
#include "kernels/backend_info.h"
#include "kernels/elementwise.h"
#include "kernels/exec.h"
#include "mpi_testing.h"
#include "parallel/grid_comms.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"

namespace tessera {
namespace {

using testing::test_world;

template <class T>
Tensor view(std::vector<T>& v) {
  return Tensor(v.data(), dtype_of<T>(), {static_cast<int64_t>(v.size())});
}

MpiCommunicator world_comm() { return MpiCommunicator::duplicate(test_world()); }

TEST(Communicator, SizeAndRankMatchTheWorld) {
  const MpiCommunicator c = world_comm();
  EXPECT_EQ(c.size(), comm_size(test_world()));
  EXPECT_EQ(c.rank(), comm_rank(test_world()));
}

TEST(Communicator, AllReduceSumsAndAverages) {
  MpiCommunicator c = world_comm();
  const int p = c.size(), r = c.rank();
  std::vector<float> f(5);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r + 1) * static_cast<float>(i + 1);
  c.all_reduce(view(f));
  const float ranks_sum = static_cast<float>(p * (p + 1) / 2);  // sum of (r + 1)
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], ranks_sum * static_cast<float>(i + 1));

  std::vector<double> d = {static_cast<double>(r), 1.0, -2.0 * r};
  c.all_reduce(view(d), ReduceOp::Average);
  EXPECT_DOUBLE_EQ(d[0], (p - 1) / 2.0);
  EXPECT_DOUBLE_EQ(d[1], 1.0);
  EXPECT_DOUBLE_EQ(d[2], -(p - 1.0));
}

TEST(Communicator, ReduceScatterGivesEachRankItsChunk) {
  MpiCommunicator c = world_comm();
  const int p = c.size(), r = c.rank(), n = 3;
  std::vector<float> in(static_cast<size_t>(p * n)), out(n);
  for (int chunk = 0; chunk < p; ++chunk)
    for (int i = 0; i < n; ++i) in[static_cast<size_t>(chunk * n + i)] = static_cast<float>(100 * r + 10 * chunk + i);
  c.reduce_scatter(view(in), view(out));
  // sum over ranks k of (100 k + 10 r + i)
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], static_cast<float>(100 * p * (p - 1) / 2 + p * (10 * r + i)));

  std::vector<double> din(static_cast<size_t>(p), static_cast<double>(r)), dout(1);
  c.reduce_scatter(view(din), view(dout), ReduceOp::Average);
  EXPECT_DOUBLE_EQ(dout[0], (p - 1) / 2.0);
}

TEST(Communicator, AllGatherConcatenatesByRank) {
  MpiCommunicator c = world_comm();
  const int p = c.size(), r = c.rank(), n = 2;
  std::vector<int32_t> in = {10 * r, 10 * r + 1}, out(static_cast<size_t>(p * n), -1);
  c.all_gather(view(in), view(out));
  for (int k = 0; k < p; ++k) {
    EXPECT_EQ(out[static_cast<size_t>(k * n)], 10 * k);
    EXPECT_EQ(out[static_cast<size_t>(k * n + 1)], 10 * k + 1);
  }
}

TEST(Communicator, BroadcastCopiesTheRoot) {
  MpiCommunicator c = world_comm();
  const int root = c.size() - 1;
  std::vector<double> v(4, static_cast<double>(c.rank()));
  c.broadcast(view(v), root);
  for (double x : v) EXPECT_EQ(x, root);
}

TEST(Communicator, SendRecvAroundARing) {
  MpiCommunicator c = world_comm();
  const int p = c.size(), r = c.rank();
  std::vector<float> mine = {static_cast<float>(r), static_cast<float>(r) + 0.5f}, theirs(2, -1.0f);
  CommHandle in = c.recv_async(view(theirs), (r + p - 1) % p, 7);
  CommHandle out = c.send_async(view(mine), (r + 1) % p, 7);
  out.wait();
  in.wait();
  const float prev = static_cast<float>((r + p - 1) % p);
  EXPECT_EQ(theirs[0], prev);
  EXPECT_EQ(theirs[1], prev + 0.5f);
  EXPECT_TRUE(in.done());
}

// stage_through_host(compute, always = true): every op through host copies, on CPU tensors (the
// path device tensors take with train.device = "cuda" and parallel.comm = "mpi"): the same results
// as the direct path, in place and out of place, averaged on the host copy, with several ops in
// flight at once and the copies' blocks reused across ops.
TEST(Communicator, StagedThroughHostBuffersGivesTheSameResults) {
  MpiCommunicator c = world_comm();
  c.stage_through_host(Exec::cpu(), /*always=*/true);
  const int p = c.size(), r = c.rank();
  for (int round = 0; round < 2; ++round) {  // the second round reuses the first's staging blocks
    std::vector<float> f(5);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r + 1) * static_cast<float>(i + 1);
    std::vector<double> d = {static_cast<double>(r), 1.0};
    CommHandle hf = c.all_reduce_async(view(f));
    CommHandle hd = c.all_reduce_async(view(d), ReduceOp::Average);
    hd.wait_on(Exec::cpu());
    hf.wait();
    for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(p * (p + 1) / 2) * static_cast<float>(i + 1));
    EXPECT_DOUBLE_EQ(d[0], (p - 1) / 2.0);
    EXPECT_DOUBLE_EQ(d[1], 1.0);

    std::vector<double> din(static_cast<size_t>(2 * p)), dout(2, -1.0);
    for (int k = 0; k < 2 * p; ++k) din[static_cast<size_t>(k)] = 100.0 * r + k;
    c.reduce_scatter(view(din), view(dout), ReduceOp::Average);
    for (int i = 0; i < 2; ++i) EXPECT_DOUBLE_EQ(dout[static_cast<size_t>(i)], 100.0 * (p - 1) / 2.0 + 2 * r + i);

    std::vector<int32_t> in = {10 * r, 10 * r + 1}, out(static_cast<size_t>(2 * p), -1);
    c.all_gather(view(in), view(out));
    for (int k = 0; k < p; ++k) EXPECT_EQ(out[static_cast<size_t>(2 * k + 1)], 10 * k + 1);

    std::vector<float> b(3, static_cast<float>(r));
    c.broadcast(view(b), p - 1);
    for (float x : b) EXPECT_EQ(x, static_cast<float>(p - 1));

    std::vector<float> mine = {static_cast<float>(r), 0.5f}, theirs(2, -1.0f);
    std::vector<int32_t> ids = {r, -r}, their_ids(2, 7);
    c.batch_send_recv({P2POp::send(view(mine), (r + 1) % p, 3), P2POp::send(view(ids), (r + 1) % p, 4),
                       P2POp::recv(view(theirs), (r + p - 1) % p, 3), P2POp::recv(view(their_ids), (r + p - 1) % p, 4)});
    const int prev = (r + p - 1) % p;
    EXPECT_EQ(theirs[0], static_cast<float>(prev));
    EXPECT_EQ(theirs[1], 0.5f);
    EXPECT_EQ(their_ids[1], -prev);

    std::vector<float> ring(2, -1.0f);
    CommHandle rin = c.recv_async(view(ring), prev, 9);
    c.send(view(mine), (r + 1) % p, 9);
    rin.wait();
    EXPECT_EQ(ring[0], static_cast<float>(prev));
  }
}

TEST(Communicator, AsyncOpsOverlapLocalWork) {
  MpiCommunicator c = world_comm();
  const int p = c.size();
  std::vector<float> a(1024, 1.0f);
  std::vector<double> b(256, 2.0);
  CommHandle ha = c.all_reduce_async(view(a));
  CommHandle hb = c.all_reduce_async(view(b), ReduceOp::Average);
  // Local work while both are in flight (buffers untouched), polling for completion.
  double local = 0;
  int polls = 0;
  for (int i = 0; !(ha.test() && hb.test()); ++i, ++polls) local += 1.0 / (i + 1);
  EXPECT_GE(local, 0.0);
  EXPECT_TRUE(ha.done() && hb.done());
  for (float x : a) ASSERT_EQ(x, static_cast<float>(p));
  for (double x : b) ASSERT_EQ(x, 2.0);
  {
    std::vector<float> scoped(8, 1.0f);
    CommHandle h = c.all_reduce_async(view(scoped));  // the destructor waits
  }
}

TEST(Communicator, ByteCountersFollowTheRingVolumes) {
  MpiCommunicator c = world_comm();
  const int64_t p = c.size(), r = c.rank();
  std::vector<float> t(16);  // 64 bytes
  std::vector<float> big(static_cast<size_t>(16 * p));
  c.all_reduce(view(t));
  EXPECT_EQ(c.counters().all_reduce, 2 * (p - 1) * 64 / p);
  c.reduce_scatter(view(big), view(t));
  EXPECT_EQ(c.counters().reduce_scatter, (p - 1) * 64);  // (p - 1) / p x (p x 64)
  c.all_gather(view(t), view(big));
  EXPECT_EQ(c.counters().all_gather, (p - 1) * 64);
  c.broadcast(view(t), 0);
  EXPECT_EQ(c.counters().broadcast, r == 0 && p > 1 ? 64 : 0);
  std::vector<float> received(16);  // a separate buffer: with one rank the ring sends to itself
  CommHandle in = c.recv_async(view(received), static_cast<int>((r + p - 1) % p));
  c.send(view(t), static_cast<int>((r + 1) % p));
  in.wait();
  EXPECT_EQ(c.counters().send, 64);
  EXPECT_EQ(c.bytes_sent(), 2 * (p - 1) * 64 / p + 2 * (p - 1) * 64 + (r == 0 && p > 1 ? 64 : 0) + 64);
  c.reset_counters();
  EXPECT_EQ(c.bytes_sent(), 0);
}

TEST(Communicator, RejectsBadArgumentsBeforeCommunicating) {
  MpiCommunicator c = world_comm();
  std::vector<int32_t> ints(4);
  std::vector<float> f(4), g(4 * c.size() + 1);
  EXPECT_THROW(c.all_reduce(view(ints)), Error);
  EXPECT_THROW(c.reduce_scatter(view(g), view(f)), Error);
  EXPECT_THROW(c.all_gather(view(f), view(g)), Error);
  EXPECT_THROW(c.broadcast(view(f), c.size()), Error);
  EXPECT_THROW(c.send(view(f), -1), Error);
  EXPECT_EQ(c.bytes_sent(), 0);  // nothing was started, nothing counted
}

// Sub-communicators of every layout that fits the world: an all_reduce of world ranks over each
// group sums exactly that group's ranks (e.g. 4 ranks as tp 2 x dp 2: the tp pair, the dp pair;
// pp 4: the embedding pair {0, 3}, the middle stages alone).
TEST(Communicator, GridGroupsReduceOnlyTheirMembers) {
  MPI_Comm world = test_world();
  const int64_t p = comm_size(world), r = comm_rank(world);
  const std::vector<GridDegrees> layouts = {{},          {.tp = 2},          {.cp = 2},          {.pp = 2},
                                            {.pp = 4},   {.tp = 2, .pp = 2}, {.tp = 2, .cp = 2}};
  for (const GridDegrees& d : layouts) {
    if (p % (d.tp * d.cp * d.pp) != 0) continue;
    const ProcessGrid grid(d, p, r);
    GridComms comms = mpi_grid_comms(grid, world);
    auto check = [&](Communicator& c, const std::vector<int64_t>& group, const char* name) {
      EXPECT_EQ(c.size(), static_cast<int>(group.size())) << name;
      EXPECT_EQ(group[static_cast<size_t>(c.rank())], r) << name;
      std::vector<double> v = {static_cast<double>(r)};
      c.all_reduce(view(v));
      EXPECT_EQ(v[0], static_cast<double>(std::accumulate(group.begin(), group.end(), int64_t{0})))
          << name << " on grid " << grid.coords().str();
    };
    check(*comms.tp, grid.tp_group(), "tp");
    check(*comms.cp, grid.cp_group(), "cp");
    check(*comms.dp, grid.dp_group(), "dp");
    check(*comms.pp, grid.pp_group(), "pp");
    check(*comms.dp_cp, grid.dp_cp_group(), "dp_cp");
    check(*comms.tp_cp, grid.tp_cp_group(), "tp_cp");
    check(*comms.embedding, grid.embedding_group(), "embedding");
    std::vector<int64_t> everyone(static_cast<size_t>(p));
    std::iota(everyone.begin(), everyone.end(), int64_t{0});
    check(*comms.world, everyone, "world");
    EXPECT_EQ(comms.tp->rank(), grid.tp_rank());
    EXPECT_EQ(comms.dp->rank(), grid.dp_rank());
    EXPECT_EQ(comms.pp->rank(), grid.pp_rank());
    EXPECT_EQ(comms.world->rank(), r);
    // all(): every group once, in member order (profilers and counters go through it).
    EXPECT_EQ(comms.all(), (std::vector<Communicator*>{comms.tp.get(), comms.cp.get(), comms.dp.get(), comms.pp.get(),
                                                      comms.dp_cp.get(), comms.tp_cp.get(), comms.embedding.get(),
                                                      comms.world.get()}));
  }
}

// A communicator whose waits yield the core (ranks sharing cores) gives what a spinning one gives:
// every op, in place and out of place, and a ring of point-to-point messages.
TEST(Communicator, YieldingWaitsGiveTheSameResults) {
  MpiCommunicator spin = world_comm();
  MpiCommunicator yield = MpiCommunicator::duplicate(test_world(), MpiWait::Yield);
  EXPECT_EQ(spin.waits(), MpiWait::Spin);
  EXPECT_EQ(yield.waits(), MpiWait::Yield);
  const int p = spin.size(), r = spin.rank();
  const auto run = [&](MpiCommunicator& c) {
    std::vector<float> sum(6), scattered(2), gathered(static_cast<size_t>(p) * 2), ring(3, -1);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<float>(r * 10 + static_cast<int>(i));
    c.all_reduce(view(sum), ReduceOp::Average);
    std::vector<float> in(static_cast<size_t>(p) * 2);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r + static_cast<int>(i));
    c.reduce_scatter(view(in), view(scattered));
    std::vector<float> mine = {static_cast<float>(r), static_cast<float>(-r)};
    c.all_gather(view(mine), view(gathered));
    std::vector<float> root(2, static_cast<float>(r));
    c.broadcast(view(root), p - 1);
    std::vector<float> out = {static_cast<float>(r), 1.5f, 2.5f};
    CommHandle got = c.recv_async(view(ring), (r + p - 1) % p, 5);
    c.send_async(view(out), (r + 1) % p, 5).wait();
    got.wait();
    std::vector<float> all = sum;
    for (const auto* v : {&scattered, &gathered, &root, &ring}) all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const std::vector<float> spun = run(spin), yielded = run(yield);
  EXPECT_EQ(spun, yielded);
  EXPECT_EQ(yielded[0], 10.0f * static_cast<float>(p - 1) / 2.0f);  // the average of r * 10
  EXPECT_EQ(yielded.back(), 2.5f);
}

// The grid's communicators wait as this node's ranks and threads say (parallel/mpi.h): yield where
// the ranks outnumber the CPUs (4 ranks on a 2-core machine), else spin.
TEST(Communicator, GridCommsWaitAsTheNodeSays) {
  MPI_Comm world = test_world();
  const int64_t p = comm_size(world);
  const ProcessGrid grid({}, p, comm_rank(world));
  GridComms comms = mpi_grid_comms(grid, world);
  const MpiWait expected = mpi_wait_on_this_node(world, cpu_threads());
  for (Communicator* c : comms.all()) EXPECT_EQ(static_cast<MpiCommunicator&>(*c).waits(), expected);
}

TEST(Communicator, GridCommsRefuseAGridOfAnotherWorld) {
  MPI_Comm world = test_world();
  const int64_t p = comm_size(world);
  const ProcessGrid grid({}, p + 1, p);  // a rank this world does not have
  EXPECT_TRUE(testing::throws_with([&] { mpi_grid_comms(grid, world); },
                                   {"GridComms: the grid is for rank " + std::to_string(p) + " of " + std::to_string(p + 1)}));
}

// The peer of this rank for the point-to-point tests: its pair partner (0-1, 2-3, ...), or itself
// alone. -1: an odd world of several ranks (not run).
int partner(const Communicator& c) {
  if (c.size() == 1) return 0;
  return c.size() % 2 == 0 ? c.rank() ^ 1 : -1;
}

// Each rank sends two 4 MiB tensors to its partner and receives two from it in ONE batch. Messages
// this large go by rendezvous (a send completes only once its receive is posted: MPICH's eager
// limit is tens of KiB), so a batch run as blocking send, send, recv, recv would deadlock here
// (the ctest timeout); started together they complete.
TEST(Communicator, BatchSendRecvExchangesLargeTensorsAtOnce) {
  MpiCommunicator c = world_comm();
  const int peer = partner(c);
  if (peer < 0) GTEST_SKIP() << "needs an even number of ranks, or one";
  constexpr size_t n = size_t{1} << 20;  // 4 MiB of f32
  const float me = static_cast<float>(c.rank()), them = static_cast<float>(peer);
  std::vector<float> a(n), b(n), got_a(n, -1.0f), got_b(n, -1.0f);
  for (size_t i = 0; i < n; ++i) {
    a[i] = me * 10.0f + static_cast<float>(i % 7);
    b[i] = -me * 10.0f - static_cast<float>(i % 5);
  }
  c.batch_send_recv({P2POp::send(view(a), peer), P2POp::send(view(b), peer, 1), P2POp::recv(view(got_a), peer),
                     P2POp::recv(view(got_b), peer, 1)});
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got_a[i], them * 10.0f + static_cast<float>(i % 7)) << i;
    ASSERT_EQ(got_b[i], -them * 10.0f - static_cast<float>(i % 5)) << i;
  }
  EXPECT_EQ(c.counters().send, static_cast<int64_t>(2 * n * sizeof(float)));  // the sends, not the receives
  EXPECT_EQ(c.bytes_sent(), c.counters().send);
}

// Four dtypes in one batch, all with the same tag: matched in posting order. The receive sizes
// differ, so a receive matched to the wrong send would fail (MPI truncation) or read wrong values.
TEST(Communicator, BatchSendRecvMovesMixedDtypesInOrder) {
  MpiCommunicator c = world_comm();
  const int peer = partner(c);
  if (peer < 0) GTEST_SKIP() << "needs an even number of ranks, or one";
  const int r = c.rank();
  std::vector<float> f = {r + 0.5f, r + 1.5f, r + 2.5f}, f_in(3);
  std::vector<int32_t> i = {r, r + 1, r + 2, r + 3, r + 4}, i_in(5);
  std::vector<uint16_t> h = {static_cast<uint16_t>(r), 0x3f80, 0xbf80, 0x7fc0}, h_in(4);  // bf16 bit patterns
  std::vector<double> d = {r * 1e-300, 1.0 / 3.0 + r}, d_in(2);
  CommHandle batch = c.batch_send_recv_async(
      {P2POp::send(view(f), peer), P2POp::send(view(i), peer), P2POp::send(Tensor(h.data(), DType::BF16, {4}), peer),
       P2POp::send(view(d), peer), P2POp::recv(view(f_in), peer), P2POp::recv(view(i_in), peer),
       P2POp::recv(Tensor(h_in.data(), DType::BF16, {4}), peer), P2POp::recv(view(d_in), peer)});
  batch.wait();
  EXPECT_TRUE(batch.done());
  const int q = peer;
  EXPECT_EQ(f_in, (std::vector<float>{q + 0.5f, q + 1.5f, q + 2.5f}));
  EXPECT_EQ(i_in, (std::vector<int32_t>{q, q + 1, q + 2, q + 3, q + 4}));
  EXPECT_EQ(h_in, (std::vector<uint16_t>{static_cast<uint16_t>(q), 0x3f80, 0xbf80, 0x7fc0}));
  EXPECT_EQ(d_in, (std::vector<double>{q * 1e-300, 1.0 / 3.0 + q}));
  EXPECT_EQ(c.counters().send, static_cast<int64_t>(3 * 4 + 5 * 4 + 4 * 2 + 2 * 8));
  CommHandle empty = c.batch_send_recv_async({});  // nothing to exchange: complete at once
  EXPECT_TRUE(empty.done());
}

// A bad op anywhere in a batch is refused before any op starts: nothing is counted, and no send of
// the refused batch is left in flight to be matched by the next receive.
TEST(Communicator, BatchSendRecvRefusesABadOpBeforeStartingAny) {
  MpiCommunicator c = world_comm();
  const int peer = partner(c);
  if (peer < 0) GTEST_SKIP() << "needs an even number of ranks, or one";
  const int p = c.size();
  std::vector<float> stray(4, -7.0f), in(4, 0.0f);
  EXPECT_EQ(testing::error_of([&] {
              c.batch_send_recv({P2POp::send(view(stray), peer), P2POp::recv(view(in), p)});
            }),
            "batch_send_recv: ops[1] (recv) src = " + std::to_string(p) + " is outside a communicator of " +
                std::to_string(p) + " ranks");
  EXPECT_EQ(testing::error_of([&] {
              c.batch_send_recv({P2POp::send(view(stray), peer), P2POp::send(Tensor(nullptr, DType::F32, {4}), peer)});
            }),
            "batch_send_recv: ops[1] (send) has no data");
  EXPECT_THROW(c.batch_send_recv({P2POp::send(view(stray), -1)}), Error);
  EXPECT_EQ(c.bytes_sent(), 0);
  std::vector<float> out(4, static_cast<float>(c.rank()));
  c.batch_send_recv({P2POp::recv(view(in), peer), P2POp::send(view(out), peer)});
  EXPECT_EQ(in, std::vector<float>(4, static_cast<float>(peer)));  // not the stray -7s
}

// wait_on(ex) on the CPU path: the MPI backend completes the op on the host (the average's division
// included), so work queued on ex afterwards reads the result, and the handle is done.
TEST(Communicator, WaitOnOrdersTheResultBeforeLaterWorkOnTheExec) {
  MpiCommunicator c = world_comm();
  const int p = c.size(), r = c.rank();
  const Exec ex = Exec::cpu();
  std::vector<double> v(300, static_cast<double>(r)), out(300, -1.0);
  CommHandle h = c.all_reduce_async(view(v), ReduceOp::Average);
  h.wait_on(ex);
  EXPECT_TRUE(h.done());
  copy(ex, view(out), view(v));  // later work on ex
  synchronize(ex);
  for (double x : out) ASSERT_DOUBLE_EQ(x, (p - 1) / 2.0);
  h.wait_on(ex);  // a done handle: nothing to do
  h.wait();

  std::vector<float> in(static_cast<size_t>(p), static_cast<float>(r)), mean(1);
  CommHandle rs = c.reduce_scatter_async(view(in), view(mean), ReduceOp::Average);
  rs.wait_on(ex);
  EXPECT_FLOAT_EQ(mean[0], static_cast<float>(p - 1) / 2.0f);

  const int peer = partner(c);
  if (peer < 0) return;
  std::vector<float> mine(8, static_cast<float>(r)), theirs(8, -1.0f);
  CommHandle batch = c.batch_send_recv_async({P2POp::recv(view(theirs), peer), P2POp::send(view(mine), peer)});
  batch.wait_on(ex);
  EXPECT_TRUE(batch.done());
  EXPECT_EQ(theirs, std::vector<float>(8, static_cast<float>(peer)));
}

// One rank's op fails its local checks; every rank agrees on the error and the communicator still
// works afterwards (no rank is left waiting in a collective).
TEST(Communicator, AnErrorOnOneRankReachesEveryRank) {
  MpiCommunicator c = world_comm();
  const int last = c.size() - 1;
  const std::string error = testing::error_of([&] {
    if (c.rank() == last) {
      std::vector<int32_t> ints(2);
      c.all_reduce(view(ints));  // rejected: integers do not reduce
    }
  });
  EXPECT_EQ(error.empty(), c.rank() != last);
  EXPECT_EQ(testing::error_of([&] { throw_if_any_failed(c.comm(), error); }),
            "all_reduce: reduces f32 or f64 tensors, got i32");
  std::vector<float> v = {1.0f};
  c.all_reduce(view(v));
  EXPECT_EQ(v[0], static_cast<float>(c.size()));
}

}  // namespace
}  // namespace tessera
