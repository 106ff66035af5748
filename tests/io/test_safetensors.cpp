// zero::safetensors: round trips in every dtype and chunking, the writer's contract, and every way
// the reader refuses a hostile file, with the message it gives.

#include "support.hpp"
#include "zero/io/safetensors.hpp"

#include <cstring>
#include <doctest/doctest.h>
#include <numeric>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace st = zero::safetensors;
using zero_test::temp_dir;
using zero_test::write_safetensors;

namespace {

template <class T> std::vector<T> values(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Multiples of 1/8 in a small range are exact in every dtype, so values compare bitwise.
    v[i] = zero::from_float<T>(static_cast<float>(static_cast<int>(i) * 3 - 20 + seed) * 0.125f);
  }
  return v;
}

template <class T> std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

/// Writes `data` to `w` in chunks whose sizes cycle through 1, 3, 7, 13, 64 and 0.
void write_chunked(st::writer& w, std::span<const std::byte> data) {
  static constexpr std::size_t sizes[] = {1, 3, 7, 0, 13, 64};
  std::size_t k = 0;
  while (!data.empty()) {
    const std::size_t n = std::min(sizes[k++ % std::size(sizes)], data.size());
    w.write(data.first(n));
    data = data.subspan(n);
  }
}

/// what() of the checkpoint_error that opening `path` throws; fails the test if it throws nothing
/// or something else.
std::string error_of(const std::filesystem::path& path) {
  try {
    st::reader r(path);
  } catch (const zero::checkpoint_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a checkpoint_error, got: " << e.what());
    return {};
  }
  FAIL("expected a checkpoint_error for " << path);
  return {};
}

bool has(const std::string& text, std::string_view part) {
  const bool found = text.find(part) != std::string::npos;
  if (!found) {
    MESSAGE("\"" << part << "\" not in: " << text);
  }
  return found;
}

} // namespace

TEST_CASE_TEMPLATE("safetensors round trip with odd chunking", T, float, zero::f16, zero::bf16) {
  temp_dir dir("st_round_trip");
  const auto path = dir / "model.safetensors";
  const zero::dtype type = zero::dtype_v<T>;
  const std::vector<T> a = values<T>(15, 0), b = values<T>(1, 5), c = values<T>(7, 9);
  {
    st::writer w(path,
                 {{"layer.0.weight", type, {3, 5}}, {"scale", type, {}}, {"empty", type, {0, 4}}, {"bias", type, {7}}},
                 {{"format", "pt"}, {"note", "ünïcode ✓"}});
    CHECK(std::filesystem::exists(path.string() + ".tmp"));
    CHECK_FALSE(std::filesystem::exists(path));
    std::vector<std::byte> all;
    for (auto s : {bytes_of(a), bytes_of(b), bytes_of(c)}) {
      all.insert(all.end(), s.begin(), s.end());
    }
    CHECK(w.data_size() == all.size());
    write_chunked(w, all);
    w.close();
  }
  CHECK(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));

  // The header length is little-endian and the data section starts 8-byte aligned.
  std::ifstream raw(path, std::ios::binary);
  std::string head(8, '\0');
  raw.read(head.data(), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(head[static_cast<std::size_t>(i)]);
  }
  CHECK((8 + n) % 8 == 0);
  const std::size_t elem = sizeof(T);
  CHECK(std::filesystem::file_size(path) == 8 + n + (15 + 1 + 7) * elem);

  st::reader r(path);
  REQUIRE(r.tensors().size() == 4);
  CHECK(r.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"note", "ünïcode ✓"}});
  const st::tensor_info* w0 = r.find("layer.0.weight");
  REQUIRE(w0 != nullptr);
  CHECK(w0->type == type);
  CHECK(w0->shape == std::vector<std::int64_t>{3, 5});
  CHECK(w0->begin == 0);
  CHECK(w0->end == 15 * elem);
  REQUIRE(r.find("scale") != nullptr);
  CHECK(r.find("scale")->shape.empty());
  CHECK(r.find("scale")->size() == elem);
  REQUIRE(r.find("empty") != nullptr);
  CHECK(r.find("empty")->size() == 0);
  CHECK(r.find("empty")->shape == std::vector<std::int64_t>{0, 4});
  CHECK(r.find("missing") == nullptr);
  // tensors() is in data-section order, which is the declaration order here.
  CHECK(r.tensors()[0].name == "layer.0.weight");
  CHECK(r.tensors()[3].name == "bias");

  // Read the first tensor in odd pieces and at an offset.
  std::vector<T> back(15);
  auto out = std::as_writable_bytes(std::span<T>(back));
  r.read(*w0, 0, out.first(5));
  r.read(*w0, 5, out.subspan(5, 17));
  r.read(*w0, 22, out.subspan(22));
  CHECK(std::memcmp(back.data(), a.data(), 15 * elem) == 0);
  std::vector<T> back_c(7);
  r.read(*r.find("bias"), 0, std::as_writable_bytes(std::span<T>(back_c)));
  CHECK(std::memcmp(back_c.data(), c.data(), 7 * elem) == 0);
  T one{};
  r.read(*r.find("scale"), 0, std::as_writable_bytes(std::span<T, 1>(&one, 1)));
  CHECK(std::memcmp(&one, b.data(), elem) == 0);
  r.read(*r.find("empty"), 0, {});
}

TEST_CASE("safetensors: mixed dtypes, no metadata, no tensors") {
  temp_dir dir("st_mixed");
  SUBCASE("every dtype zero supports in one file") {
    const auto path = dir / "mixed.safetensors";
    const std::vector<std::int64_t> steps{7, -3};
    const std::vector<std::uint8_t> mask{0, 1, 255};
    const std::vector<double> d{0.1, -2.0};
    const std::vector<std::int32_t> i{-1, 2, 3};
    {
      st::writer w(path, {{"steps", zero::dtype::i64, {2}},
                          {"mask", zero::dtype::u8, {3}},
                          {"d", zero::dtype::f64, {1, 2}},
                          {"i", zero::dtype::i32, {3}}});
      w.write(bytes_of(steps));
      w.write(bytes_of(mask));
      w.write(bytes_of(d));
      w.write(bytes_of(i));
      w.close();
    }
    st::reader r(path);
    CHECK(r.metadata().empty());
    REQUIRE(r.find("d") != nullptr);
    CHECK(r.find("d")->type == zero::dtype::f64);
    CHECK(r.find("d")->begin == 19);
    std::vector<double> back(2);
    r.read(*r.find("d"), 0, std::as_writable_bytes(std::span<double>(back)));
    CHECK(back == d);
    // Without metadata the header has no __metadata__ key at all.
    std::ifstream raw(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
    CHECK(text.find("__metadata__") == std::string::npos);
    CHECK(text.find(R"("mask":{"dtype":"U8","shape":[3],"data_offsets":[16,19]})") != std::string::npos);
  }
  SUBCASE("a file without tensors") {
    const auto path = dir / "none.safetensors";
    st::writer w(path, {}, {{"k", "v"}});
    w.close();
    st::reader r(path);
    CHECK(r.tensors().empty());
    CHECK(r.metadata().at("k") == "v");
  }
  SUBCASE("a hand-made header with padding spaces and fields in another order") {
    const auto path = dir / "hand.safetensors";
    write_safetensors(
        path,
        R"({"b":{"data_offsets":[4,12],"shape":[2,2],"dtype":"F16"},"a":{"shape":[1],"dtype":"F32","data_offsets":[0,4]}}   )",
        12);
    st::reader r(path);
    REQUIRE(r.tensors().size() == 2);
    CHECK(r.tensors()[0].name == "a");
    CHECK(r.tensors()[1].name == "b");
    CHECK(r.tensors()[1].begin == 4);
  }
}

TEST_CASE("safetensors writer misuse") {
  temp_dir dir("st_writer");
  const auto path = dir / "w.safetensors";
  const std::vector<float> four(4, 1.0f);

  SUBCASE("too many bytes") {
    st::writer w(path, {{"a", zero::dtype::f32, {3}}});
    w.write(bytes_of(four).first(8));
    CHECK_THROWS_WITH_AS(w.write(bytes_of(four).first(8)),
                         doctest::Contains("write of 8 bytes after 8 goes past the end of the data section; "
                                           "expected at most 4 more bytes"),
                         zero::usage_error);
    CHECK(w.bytes_written() == 8);
  }
  SUBCASE("too few bytes: close names the short tensor, and nothing appears at path") {
    {
      st::writer w(path, {{"a", zero::dtype::f32, {2}}, {"b", zero::dtype::f32, {3}}, {"c", zero::dtype::f16, {1}}});
      w.write(bytes_of(four).first(12));
      CHECK_THROWS_WITH_AS(w.close(), doctest::Contains("w.safetensors: incomplete: tensor 'b' has 4 of 12 bytes"),
                           zero::io_error);
    }
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  }
  SUBCASE("destroyed without close: the .tmp file goes, and an older file at path is untouched") {
    zero_test::write_bytes(path, "old");
    {
      st::writer w(path, {{"a", zero::dtype::f32, {4}}});
      w.write(bytes_of(four));
    }
    CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
    CHECK(std::filesystem::file_size(path) == 3);
  }
  SUBCASE("write or close after close") {
    st::writer w(path, {{"a", zero::dtype::f32, {4}}});
    w.write(bytes_of(four));
    w.close();
    CHECK_THROWS_AS(w.write(bytes_of(four).first(0)), zero::usage_error);
    CHECK_THROWS_WITH_AS(w.close(), doctest::Contains("close called twice"), zero::usage_error);
    CHECK(std::filesystem::exists(path));
  }
  SUBCASE("a moved writer owns the file") {
    st::writer w(path, {{"a", zero::dtype::f32, {4}}});
    st::writer moved(std::move(w));
    moved.write(bytes_of(four));
    moved.close();
    CHECK(st::reader(path).find("a") != nullptr);
  }
  SUBCASE("bad declarations") {
    CHECK_THROWS_WITH_AS(st::writer(path, {{"a", zero::dtype::f32, {1}}, {"a", zero::dtype::f16, {1}}}),
                         doctest::Contains("tensor 'a': declared twice"), zero::usage_error);
    CHECK_THROWS_WITH_AS(st::writer(path, {{"a", zero::dtype::f32, {2, -1}}}),
                         doctest::Contains("tensor 'a': shape [2, -1] has a negative extent"), zero::usage_error);
    CHECK_THROWS_WITH_AS(st::writer(path, {{"__metadata__", zero::dtype::f32, {1}}}), doctest::Contains("is reserved"),
                         zero::usage_error);
    CHECK_THROWS_WITH_AS(st::writer(path, {{"", zero::dtype::f32, {1}}}), doctest::Contains("is reserved"),
                         zero::usage_error);
    CHECK_THROWS_WITH_AS(st::writer(path, {{"huge", zero::dtype::f32, {std::int64_t{1} << 62, 8}}}),
                         doctest::Contains("byte size over 2^64"), zero::usage_error);
    CHECK_THROWS_WITH_AS(st::writer(path, {{"bad\xff", zero::dtype::f32, {1}}}), doctest::Contains("not valid UTF-8"),
                         zero::usage_error);
    CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  }
  SUBCASE("a directory that does not exist") {
    CHECK_THROWS_WITH_AS(st::writer(dir / "no" / "such.safetensors", {}), doctest::Contains("cannot create"),
                         zero::io_error);
  }
}

TEST_CASE("safetensors reader bounds") {
  temp_dir dir("st_bounds");
  const auto path = dir / "r.safetensors";
  const std::vector<float> four{1, 2, 3, 4};
  {
    st::writer w(path, {{"a", zero::dtype::f32, {4}}});
    w.write(bytes_of(four));
    w.close();
  }
  st::reader r(path);
  const st::tensor_info& a = *r.find("a");
  std::vector<std::byte> out(8);
  CHECK_THROWS_WITH_AS(r.read(a, 12, out), doctest::Contains("read of 8 bytes at offset 12 goes past its 16 bytes"),
                       zero::usage_error);
  CHECK_THROWS_AS(r.read(a, 17, std::span<std::byte>()), zero::usage_error);
  st::tensor_info forged = a;
  forged.end = 1000;
  CHECK_THROWS_WITH_AS(r.read(forged, 0, out), doctest::Contains("not inside this file's data section"),
                       zero::usage_error);
  // A file truncated after it was opened reads as an io_error, not as garbage.
  std::filesystem::resize_file(path, 8);
  CHECK_THROWS_WITH_AS(r.read(a, 0, out), doctest::Contains("the file ended early"), zero::io_error);
  CHECK_THROWS_WITH_AS(st::reader(dir / "missing.safetensors"), doctest::Contains("cannot open"), zero::io_error);
  CHECK(has(error_of(dir.path()), "not a regular file"));
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK(has(error_of(dir / "fifo"), "not a regular file"));
}

TEST_CASE("safetensors reader refuses hostile files, naming file, tensor and expectation") {
  temp_dir dir("st_hostile");
  const auto path = dir / "bad.safetensors";
  // A valid single tensor, for cases that vary one thing.
  const auto one = [&](std::string_view fields, std::size_t data) {
    write_safetensors(path, "{\"t\":{" + std::string(fields) + "}}", data);
    return error_of(path);
  };

  SUBCASE("every refusal is a checkpoint_error naming the file") {
    write_safetensors(path, "[]", 0);
    const std::string e = error_of(path);
    CHECK(e.rfind("[zero.checkpoint_error] " + path.string() + ": ", 0) == 0);
  }
  SUBCASE("shorter than the length field") {
    zero_test::write_bytes(path, "abc");
    CHECK(has(error_of(path), "the file is 3 bytes; expected at least the 8-byte header length"));
  }
  SUBCASE("header length over 100 MB") {
    zero_test::write_bytes(path, zero_test::le64(std::uint64_t{1} << 40) + "{}");
    CHECK(has(error_of(path), "header length 1099511627776 exceeds the limit of 100000000 bytes"));
  }
  SUBCASE("header length past the end of the file") {
    zero_test::write_bytes(path, zero_test::le64(50) + "{}");
    CHECK(has(error_of(path), "header length 50 exceeds the 2 bytes after the length field"));
  }
  SUBCASE("not JSON, or JSON that is not an object") {
    write_safetensors(path, "", 0);
    CHECK(has(error_of(path), "does not start with '{'"));
    write_safetensors(path, "[1,2]", 0);
    CHECK(has(error_of(path), "does not start with '{'"));
    write_safetensors(path, "{\"a\":", 0);
    CHECK(has(error_of(path), "the header is not valid JSON"));
    write_safetensors(path, "{}  x", 0);
    CHECK(has(error_of(path), "the header is not valid JSON"));
    write_safetensors(path, "{\"bad\xc3\x28\":1}", 0);
    CHECK(has(error_of(path), "the header is not valid JSON"));
  }
  SUBCASE("unknown or unsupported dtypes, listing the supported ones") {
    CHECK(has(one(R"("dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1])", 1),
              "tensor 't' has dtype \"F8_E4M3\", which zero does not support; expected one of F32, F16, BF16, F64, "
              "I32, I64, U8"));
    CHECK(has(one(R"("dtype":"BOOL","shape":[1],"data_offsets":[0,1])", 1), "dtype \"BOOL\""));
    CHECK(has(one(R"("dtype":"f32","shape":[1],"data_offsets":[0,4])", 4), "dtype \"f32\""));
    CHECK(has(one(R"("dtype":32,"shape":[1],"data_offsets":[0,4])", 4), "tensor 't' dtype is a number"));
  }
  SUBCASE("bad shapes") {
    CHECK(has(one(R"("dtype":"F32","shape":[2,-1],"data_offsets":[0,0])", 0),
              "tensor 't' shape has the element -1; expected non-negative integers"));
    CHECK(has(one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])", 8), "shape has the element 2.0"));
    CHECK(has(one(R"("dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8])", 8),
              "shape has the element 9223372036854775808"));
    CHECK(has(one(R"("dtype":"F32","shape":"[2]","data_offsets":[0,8])", 8), "tensor 't' shape is a string"));
  }
  SUBCASE("shape x dtype size overflows 64 bits") {
    CHECK(has(one(R"("dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0])", 0),
              "tensor 't' shape [4611686018427387904, 4] of F32 overflows 64 bits"));
    CHECK(has(one(R"("dtype":"BF16","shape":[4294967296,4294967296,2],"data_offsets":[0,0])", 0), "overflows 64 bits"));
    // Large but representable: caught as a mismatch with data_offsets instead.
    CHECK(has(one(R"("dtype":"BF16","shape":[9223372036854775807],"data_offsets":[0,0])", 0),
              "hold 0 bytes; expected 18446744073709551614"));
  }
  SUBCASE("shape does not match data_offsets") {
    CHECK(has(one(R"("dtype":"F32","shape":[2,3],"data_offsets":[0,20])", 20),
              "tensor 't' data_offsets [0, 20] hold 20 bytes; expected 24 for shape [2, 3] of F32"));
    CHECK(has(one(R"("dtype":"F16","shape":[2],"data_offsets":[8,4])", 8), "end before they begin"));
    CHECK(has(one(R"("dtype":"F16","shape":[2],"data_offsets":[0])", 4),
              "tensor 't' data_offsets is [0]; expected [begin, end]"));
    CHECK(has(one(R"("dtype":"F16","shape":[2],"data_offsets":[0,-4])", 4), "data_offsets is [0,-4]"));
  }
  SUBCASE("offsets outside the file") {
    CHECK(has(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])", 8),
              "tensor 't' data_offsets [0, 16] go past the end of the file; the data section holds 8 bytes"));
    CHECK(has(one(R"("dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615])", 1),
              "leave a gap after the header; expected it to begin at 0"));
  }
  SUBCASE("overlapping and gapped ranges") {
    write_safetensors(
        path,
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        12);
    CHECK(has(error_of(path), "tensor 'b' data_offsets [4, 12] overlap tensor 'a' ending at 8"));
    write_safetensors(
        path,
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
        20);
    CHECK(has(error_of(path),
              "tensor 'b' data_offsets [12, 20] leave a gap after tensor 'a'; expected it to begin at 8"));
    write_safetensors(path, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
    CHECK(has(error_of(path), "leave a gap after the header; expected it to begin at 0"));
  }
  SUBCASE("duplicate names and fields") {
    write_safetensors(
        path,
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
        8);
    CHECK(has(error_of(path), "the header has the key 'a' twice"));
    CHECK(has(one(R"("dtype":"F32","shape":[1],"dtype":"F16","data_offsets":[0,4])", 4), "the key 'dtype' twice"));
    write_safetensors(path, R"({"__metadata__":{"k":"1","k":"2"}})", 0);
    CHECK(has(error_of(path), "the key 'k' twice"));
  }
  SUBCASE("nesting and array lengths no header has") {
    CHECK(has(one(R"("dtype":"F32","shape":[[1]],"data_offsets":[0,4])", 4),
              "the header nests deeper than a safetensors header"));
    write_safetensors(path, R"({"__metadata__":{"k":{"a":[1]}}})", 0);
    CHECK(has(error_of(path), "nests deeper"));
    std::string shape = "[1";
    for (int i = 0; i < 64; ++i) {
      shape += ",1";
    }
    CHECK(has(one(R"("dtype":"F32","shape":)" + shape + R"(],"data_offsets":[0,4])", 4),
              "the header has an array of more than 64 elements; expected shapes of at most 64 dimensions"));
    CHECK_THROWS_WITH_AS(st::writer(dir / "w.safetensors", {{"a", zero::dtype::f32, std::vector<std::int64_t>(65, 1)}}),
                         doctest::Contains("tensor 'a': has 65 dimensions; expected at most 64"), zero::usage_error);
  }
  SUBCASE("metadata that is not string to string") {
    write_safetensors(path, R"({"__metadata__":{"epoch":3}})", 0);
    CHECK(has(error_of(path), "__metadata__ key 'epoch' is a number; expected a string"));
    write_safetensors(path, R"({"__metadata__":{"flag":true}})", 0);
    CHECK(has(error_of(path), "__metadata__ key 'flag' is a boolean; expected a string"));
    write_safetensors(path, R"({"__metadata__":{"nested":{"a":"b"}}})", 0);
    CHECK(has(error_of(path), "__metadata__ key 'nested' is an object; expected a string"));
    write_safetensors(path, R"({"__metadata__":["a"]})", 0);
    CHECK(has(error_of(path), "__metadata__ is an array; expected an object of strings"));
  }
  SUBCASE("trailing garbage after the last tensor") {
    CHECK(has(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4])", 7),
              "3 bytes of trailing data after the last tensor 't'; expected 4 data bytes"));
    write_safetensors(path, "{}", 5);
    CHECK(has(error_of(path), "5 bytes of trailing data after the header; expected 0 data bytes"));
  }
  SUBCASE("tensor entries of the wrong form") {
    write_safetensors(path, R"({"t":[1,2]})", 0);
    CHECK(has(error_of(path), "tensor 't' is an array; expected an object with dtype, shape and data_offsets"));
    CHECK(has(one(R"("dtype":"F32","shape":[1])", 4), "tensor 't' has no data_offsets"));
    CHECK(has(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1)", 4),
              "tensor 't' has the unknown field 'extra'; expected only dtype, shape and data_offsets"));
  }
}
