// zero-ranks-demo: the flat layout and the in-process communicator at work.
//
// Lays out the parameters of a small transformer block over N ranks, fills every rank's
// gradients, reduce-scatters each segment in place (each rank keeps only its shard, as ZeRO
// stage 2 does), all-gathers the averaged shards back (as stage 1 and 2 do after the step),
// checks every element against a single-process reference, and prints what each rank holds.

#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <zero/zero.hpp>

int main(int argc, char** argv) {
  CLI::App app{"zero-ranks-demo: shard a model's gradients over in-process ranks"};
  int ranks = 4;
  int hidden = 256;
  std::size_t bucket_bytes = 1 << 18;
  app.add_option("--ranks", ranks, "number of in-process ranks")->check(CLI::Range(1, 64));
  app.add_option("--hidden", hidden, "hidden size of the block")->check(CLI::Range(8, 4096));
  app.add_option("--bucket-bytes", bucket_bytes, "most bytes of parameters per reduce bucket");
  CLI11_PARSE(app, argc, argv);

  zero::flat_layout layout(zero::dtype::f32);
  const std::int64_t h = hidden;
  const int attn = layout.add_module("attn");
  const int mlp = layout.add_module("mlp");
  layout.add("attn.qkv.weight", {3 * h, h}, zero::dtype::f32, attn);
  layout.add("attn.qkv.bias", {3 * h}, zero::dtype::f32, attn);
  layout.add("attn.out.weight", {h, h}, zero::dtype::f32, attn);
  layout.add("mlp.fc1.weight", {4 * h, h}, zero::dtype::f32, mlp);
  layout.add("mlp.fc1.bias", {4 * h}, zero::dtype::f32, mlp);
  layout.add("mlp.fc2.weight", {h, 4 * h}, zero::dtype::f32, mlp);
  layout.finalize({.world_size = ranks, .alignment_bytes = 256, .segment_bytes = bucket_bytes});

  std::printf("%zu parameters, %zu elements, %zu segments, padded to %zu (%zu padding)\n", layout.param_count(),
              layout.numel(), layout.segments().size(), layout.total_size(), layout.padding());

  // Rank r's gradient of flat element i: small integers so that the average is exact.
  auto grad = [](int r, std::size_t i) { return static_cast<float>(static_cast<int>((i * 7 + r * 3) % 11) - 5); };
  std::vector<float> expected(layout.total_size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    float sum = 0;
    for (int r = 0; r < ranks; ++r) {
      sum += grad(r, i);
    }
    expected[i] = sum / static_cast<float>(ranks);
  }

  std::vector<std::size_t> mismatches(static_cast<std::size_t>(ranks));
  zero::run_ranks(ranks, [&](zero::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<float> flat(layout.total_size());
    for (std::size_t i = 0; i < flat.size(); ++i) {
      flat[i] = grad(r, i);
    }
    std::vector<float> shard(layout.shard_size());
    // Every segment is a bucket: reduce-scatter into this rank's slice, then gather it back.
    std::vector<zero::thread_communicator::handle> pending;
    for (const auto& s : layout.segments()) {
      pending.push_back(comm.reduce_scatter(flat.data() + s.range.begin, shard.data() + s.shard_offset, s.slice,
                                            zero::reduce_op::avg));
    }
    for (auto& p : pending) {
      p.wait();
    }
    for (const auto& s : layout.segments()) {
      comm.all_gather(shard.data() + s.shard_offset, flat.data() + s.range.begin, s.slice).wait();
    }
    std::size_t bad = 0;
    for (std::size_t i = 0; i < flat.size(); ++i) {
      bad += flat[i] != expected[i];
    }
    mismatches[static_cast<std::size_t>(r)] = bad;
  });

  std::printf("rank  shard elements  shard bytes  full bytes  mismatches\n");
  for (int r = 0; r < ranks; ++r) {
    std::printf("%4d  %14zu  %11zu  %10zu  %10zu\n", r, layout.shard_size(), layout.shard_size() * 4,
                layout.total_size() * 4, mismatches[static_cast<std::size_t>(r)]);
  }
  std::size_t total_bad = 0;
  for (auto m : mismatches) {
    total_bad += m;
  }
  if (total_bad != 0) {
    std::printf("ranks disagree with the reference in %zu elements\n", total_bad);
    return 1;
  }
  std::printf("all ranks agree with the single-process reference\n");
  return 0;
}
