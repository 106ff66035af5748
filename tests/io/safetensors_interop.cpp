// Interop between zero::safetensors and Python's safetensors package, in both directions:
//   1. zero writes zero_written.safetensors; `PYTHON check_safetensors.py check FILE` loads it with
//      the Python package and checks names, dtypes, shapes, values and metadata.
//   2. `PYTHON check_safetensors.py write DIR` writes from_python.safetensors with
//      safetensors.numpy.save_file (and from_python_bf16.safetensors, as numpy has no bf16); zero's
//      reader reads both and checks the same things.
// The values are small multiples of 1/8 (exact in every dtype) defined identically in the script.
//
//   safetensors_interop PYTHON SCRIPT DIR
// Exit status 0 on success, 1 on a mismatch, 77 (ctest's SKIP_RETURN_CODE) when PYTHON is missing.

#include "zero/io/safetensors.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <unistd.h>
#include <vector>

namespace st = zero::safetensors;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "MISMATCH: " << what << "\n";
    ++failures;
  }
}

// The tensors both sides write and expect; keep in step with check_safetensors.py.
std::vector<float> w_values() { // "w": F32 [3, 5], (i - 7) / 4
  std::vector<float> v(15);
  for (int i = 0; i < 15; ++i) {
    v[static_cast<std::size_t>(i)] = static_cast<float>(i - 7) * 0.25f;
  }
  return v;
}
std::vector<zero::f16> h_values() { // "h": F16 [4]
  return {zero::f16(1.0f), zero::f16(-2.5f), zero::f16(0.125f), zero::f16(65504.0f)};
}
std::vector<zero::bf16> b_values() { // "b": BF16 [2, 3], i / 2 - 1
  std::vector<zero::bf16> v;
  for (int i = 0; i < 6; ++i) {
    v.emplace_back(static_cast<float>(i) * 0.5f - 1.0f);
  }
  return v;
}
const std::vector<std::int64_t> steps_values{7, -3};            // "steps": I64 [2]
const std::vector<std::uint8_t> mask_values{0, 1, 2, 254, 255}; // "mask": U8 [5]
const float lr_value = 0.001f;                                  // "lr": F32 []

template <class T> std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

/// Checks that `r` holds tensor `name` of `type` and `shape` whose bytes equal `want`.
template <class T>
void check_tensor(const st::reader& r, const std::string& name, zero::dtype type, std::vector<std::int64_t> shape,
                  const std::vector<T>& want) {
  const st::tensor_info* t = r.find(name);
  if (t == nullptr) {
    expect(false, r.path().string() + ": no tensor '" + name + "'");
    return;
  }
  expect(t->type == type,
         name + ": dtype " + std::string(zero::name_of(t->type)) + ", expected " + std::string(zero::name_of(type)));
  expect(t->shape == shape,
         name + ": shape " + st::detail::shape_text(t->shape) + ", expected " + st::detail::shape_text(shape));
  if (t->size() != want.size() * sizeof(T)) {
    expect(false,
           name + ": " + std::to_string(t->size()) + " bytes, expected " + std::to_string(want.size() * sizeof(T)));
    return;
  }
  std::vector<T> got(want.size());
  r.read(*t, 0, std::as_writable_bytes(std::span<T>(got)));
  // An empty tensor has no bytes to compare (and its vectors may hold null pointers, which memcmp rejects).
  expect(t->size() == 0 || std::memcmp(got.data(), want.data(), t->size()) == 0, name + ": values differ");
}

int run(const std::string& command) {
  std::cout << "+ " << command << std::endl;
  const int rc = std::system(command.c_str());
  return rc;
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return q + "'";
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: safetensors_interop PYTHON SCRIPT DIR\n";
    return 2;
  }
  const std::string python = argv[1];
  const std::string script = argv[2];
  const std::filesystem::path dir = argv[3];
  if (python.empty() || python.ends_with("NOTFOUND") || ::access(python.c_str(), X_OK) != 0) {
    std::cout << "python3 not found (\"" << python << "\"): safetensors interop test skipped\n";
    return 77;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  // 1. zero -> Python.
  const auto ours = dir / "zero_written.safetensors";
  {
    const std::vector<float> lr{lr_value};
    const std::vector<zero::f16> none;
    const auto w_data = w_values();
    const auto h_data = h_values();
    const auto b_data = b_values();
    st::writer w(ours,
                 {{"w", zero::dtype::f32, {3, 5}},
                  {"h", zero::dtype::f16, {4}},
                  {"b", zero::dtype::bf16, {2, 3}},
                  {"steps", zero::dtype::i64, {2}},
                  {"mask", zero::dtype::u8, {5}},
                  {"lr", zero::dtype::f32, {}},
                  {"none", zero::dtype::f16, {0, 3}}},
                 {{"producer", "zero"}, {"format", "np"}});
    for (auto bytes : {bytes_of(w_data), bytes_of(h_data), bytes_of(b_data), bytes_of(steps_values),
                       bytes_of(mask_values), bytes_of(lr), bytes_of(none)}) {
      // Odd chunks, so the Python side also sees a file written piecewise.
      while (!bytes.empty()) {
        const std::size_t n = std::min<std::size_t>(5, bytes.size());
        w.write(bytes.first(n));
        bytes = bytes.subspan(n);
      }
    }
    w.close();
  }
  if (run(quoted(python) + " " + quoted(script) + " check " + quoted(ours.string())) != 0) {
    std::cerr << "FAIL: check_safetensors.py check failed on the file zero wrote (see above)\n";
    return 1;
  }

  // 2. Python -> zero.
  if (run(quoted(python) + " " + quoted(script) + " write " + quoted(dir.string())) != 0) {
    std::cerr << "FAIL: check_safetensors.py could not write its files\n";
    return 1;
  }
  try {
    const st::reader r(dir / "from_python.safetensors");
    expect(r.tensors().size() == 6,
           "from_python.safetensors: " + std::to_string(r.tensors().size()) + " tensors, expected 6");
    check_tensor(r, "w", zero::dtype::f32, {3, 5}, w_values());
    check_tensor(r, "h", zero::dtype::f16, {4}, h_values());
    check_tensor(r, "steps", zero::dtype::i64, {2}, steps_values);
    check_tensor(r, "mask", zero::dtype::u8, {5}, mask_values);
    check_tensor(r, "lr", zero::dtype::f32, {}, std::vector<float>{lr_value});
    check_tensor(r, "none", zero::dtype::f16, {0, 3}, std::vector<zero::f16>{});
    expect(r.metadata() == std::map<std::string, std::string>{{"producer", "python"}, {"format", "np"}},
           "from_python.safetensors: metadata differs");

    const st::reader rb(dir / "from_python_bf16.safetensors");
    expect(rb.tensors().size() == 1, "from_python_bf16.safetensors: expected 1 tensor");
    check_tensor(rb, "b", zero::dtype::bf16, {2, 3}, b_values());
  } catch (const zero::error& e) {
    std::cerr << "FAIL: " << e.what() << "\n";
    return 1;
  }
  if (failures != 0) {
    std::cerr << failures << " mismatches\n";
    return 1;
  }
  std::cout << "safetensors interop: zero -> Python and Python -> zero agree\n";
  return 0;
}
