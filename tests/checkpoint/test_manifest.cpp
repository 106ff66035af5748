// The manifest reader on its own: a round trip, and hostile manifests refused by name.

#include "zero/checkpoint/manifest.hpp"

#include <cstdint>
#include <doctest/doctest.h>
#include <string>
#include <vector>

using zero::checkpoint::manifest;

namespace {

manifest sample() {
  manifest m;
  m.tag = "t";
  m.world_size = 2;
  m.stage = 1;
  m.param_dtype = zero::dtype::bf16;
  m.config_xxh64 = 0x0123456789abcdefull;
  m.global_steps = 3;
  m.micro_steps = 6;
  m.boundaries = 3;
  m.modules = {"fc"};
  m.groups = {{1e-3, 0.1}};
  m.params = {{"w", {3, 4}, zero::dtype::bf16, "fc", true, 0, 12}, {"f", {2}, zero::dtype::bf16, "fc", false, 0, 2}};
  m.files = {{"rank-00000.bin", "shard", 0, 72, 1, {{0, 0, 6, 0}}},
             {"rank-00001.bin", "shard", 1, 72, 2, {{0, 6, 6, 0}}},
             {"frozen.bin", "frozen", 0, 4, 3, {{1, 0, 2, 0}}}};
  return m;
}

std::string error_of(const nlohmann::json& j) {
  try {
    static_cast<void>(manifest::parse(j.dump(), "m.json"));
  } catch (const zero::checkpoint_error& e) {
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("a manifest reads back as written") {
  const auto j = sample().to_json();
  const auto back = manifest::parse(j.dump(), "m.json");
  CHECK(back.to_json() == j);
  CHECK(back.params[0].numel == 12);
  CHECK(back.files[1].pieces[0].offset == 6);
}

TEST_CASE("hostile manifests are refused with the field named") {
  auto j = sample().to_json();
  CHECK(error_of(j).empty());
  auto bad = j;
  bad["files"][0]["name"] = "../../etc/passwd";
  CHECK(error_of(bad).find("m.json: files[0].name: found \"../../etc/passwd\", expected a plain file name") !=
        std::string::npos);
  bad = j;
  bad["files"][1]["pieces"][0]["offset"] = 5;
  CHECK(error_of(bad).find("parameter \"w\": elements from 5 are stored twice") != std::string::npos);
  bad = j;
  bad["files"][1]["pieces"][0]["count"] = 5;
  bad["files"][1]["size"] = 60; // the file as long as its pieces
  CHECK(error_of(bad).find("parameter \"w\": elements [11, 12) are in no file") != std::string::npos);
  bad = j;
  bad["files"][0]["pieces"][0]["count"] = 1ull << 60;
  CHECK(error_of(bad).find("files[0].pieces[0].count: found 1152921504606846976, expected at most "
                           "281474976710656") != std::string::npos);
  bad = j;
  bad["files"][0]["pieces"][0]["byte_offset"] = 1;
  CHECK(error_of(bad).find("files[0].pieces[0].byte_offset: bytes [1, +72) run past the file's size 72") !=
        std::string::npos);
  bad = j;
  bad["params"][0]["shape"] = {1 << 30, 1 << 30, 1 << 30};
  CHECK(error_of(bad).find("params[0].shape: found [1073741824,1073741824,1073741824]: more than 2^48 elements") !=
        std::string::npos);
  bad = j;
  bad["files"][2]["pieces"][0]["param"] = "w";
  CHECK(error_of(bad).find("\"w\" is trainable but this is a frozen file") != std::string::npos);
  bad = j;
  bad["files"][0]["xxh64"] = "xyz";
  CHECK(error_of(bad).find("files[0].xxh64: found \"xyz\", expected 16 lowercase hex digits") != std::string::npos);
  bad = j;
  bad["files"][1]["pieces"][0]["byte_offset"] = 2;
  bad["files"][1]["size"] = 74;
  CHECK(error_of(bad).find("files[1].pieces[0].byte_offset: found 2, expected a multiple of 4") != std::string::npos);
  bad = j;
  bad["files"][1]["size"] = 76;
  CHECK(error_of(bad).find("files[1].size: found 76; its pieces end at 72") != std::string::npos);
  bad = j;
  bad.erase("stage");
  CHECK(error_of(bad).find("m.json: stage: missing") != std::string::npos);
  bad = j;
  bad["format"] = "safetensors";
  CHECK(error_of(bad).find("m.json: format: found \"safetensors\", expected \"zero-checkpoint\"") != std::string::npos);
  // A key given twice: nlohmann alone would keep the last.
  std::string text = j.dump();
  text.insert(1, "\"stage\":3,");
  try {
    static_cast<void>(manifest::parse(text, "m.json"));
    FAIL("a duplicate key was accepted");
  } catch (const zero::checkpoint_error& e) {
    CHECK(std::string(e.what()) == "[zero.checkpoint_error] m.json: stage: duplicate key; give each key once; expected "
                                   "a zero checkpoint manifest");
  }
}

TEST_CASE("a model-parallel manifest records its coordinates and split dimensions, and refuses bad ones") {
  manifest m = sample();
  m.model = zero::checkpoint::model_entry{1, 1, 2};
  m.params[0].tensor_split = 1;
  const auto j = m.to_json();
  CHECK(j["model"] == nlohmann::json{{"pipe", 1}, {"tensor", 1}, {"tensor_size", 2}});
  CHECK(j["params"][0]["tensor_split"] == 1);
  CHECK_FALSE(j["params"][1].contains("tensor_split")); // a whole tensor: no key
  const auto back = manifest::parse(j.dump(), "m.json");
  CHECK(back.to_json() == j);
  REQUIRE(back.model.has_value());
  CHECK(back.model->tensor == 1);
  CHECK(back.params[0].tensor_split == 1);
  CHECK(back.params[1].tensor_split == -1);
  CHECK_FALSE(manifest::parse(sample().to_json().dump(), "m.json").model.has_value());
  auto bad = j;
  bad["model"]["tensor"] = 2;
  CHECK(error_of(bad).find("m.json: model.tensor: found 2, expected at most 1") != std::string::npos);
  bad = j;
  bad["model"]["tensor_size"] = 0;
  CHECK(error_of(bad).find("m.json: model.tensor_size: found 0") != std::string::npos);
  bad = j;
  bad["model"] = "pipe 0";
  CHECK(error_of(bad).find("m.json: model: expected an object") != std::string::npos);
  bad = j;
  bad["params"][0]["tensor_split"] = 2; // w is 2-dimensional
  CHECK(error_of(bad).find("m.json: params[0].tensor_split: found 2, expected at most 1") != std::string::npos);
  bad = j;
  bad["params"][0]["tensor_split"] = -1;
  CHECK(error_of(bad).find("params[0].tensor_split: found -1, expected a value in [0, 1]") != std::string::npos);
}

TEST_CASE("ZenFlow's block and window files read back, and bad ones are refused by name") {
  manifest m = sample();
  m.zenflow = zero::checkpoint::zenflow_entry{.window_steps = 2, .selected = true, .columns = {{0, {1, 3}}}};
  m.files.push_back({"zenflow-00000.bin", "zenflow", 0, 24, 4, {{0, 0, 6, 0}}});
  m.files.push_back({"zenflow-00001.bin", "zenflow", 1, 24, 5, {{0, 6, 6, 0}}});
  const auto j = m.to_json();
  CHECK(j["zenflow"] == nlohmann::json::parse(R"({"window_steps": 2, "selected": true,
                                                  "columns": [{"param": "w", "columns": [1, 3]}]})"));
  const auto back = manifest::parse(j.dump(), "m.json");
  CHECK(back.to_json() == j);
  REQUIRE(back.zenflow.has_value());
  CHECK(back.zenflow->columns.front().second == std::vector<std::int64_t>{1, 3});
  auto bad = j;
  bad.erase("zenflow");
  CHECK(error_of(bad).find("m.json: files: has files of kind \"zenflow\" but the manifest has no \"zenflow\" block") !=
        std::string::npos);
  bad = j;
  bad["zenflow"]["columns"][0]["columns"] = {3, 1};
  CHECK(error_of(bad).find("zenflow.columns[0].columns: found 1; expected ascending columns in [0, 4)") !=
        std::string::npos);
  bad = j;
  bad["zenflow"]["columns"][0]["columns"] = {4};
  CHECK(error_of(bad).find("expected ascending columns in [0, 4)") != std::string::npos);
  bad = j;
  bad["zenflow"]["columns"][0]["param"] = "f";
  CHECK(error_of(bad).find("zenflow.columns[0].param: \"f\": expected a trainable 2-D parameter of params, named "
                           "once") != std::string::npos);
  bad = j;
  bad["zenflow"]["window_steps"] = -1;
  CHECK(error_of(bad).find("zenflow.window_steps") != std::string::npos);
  bad = j;
  bad["files"][4]["pieces"][0]["count"] = 5;
  bad["files"][4]["size"] = 20;
  CHECK(error_of(bad).find("parameter \"w\": elements [11, 12) are in no file of kind \"zenflow\"") !=
        std::string::npos);
  bad = j;
  bad["files"][3]["kind"] = "window";
  CHECK(error_of(bad).find("files[3].kind: found \"window\", expected \"shard\", \"frozen\" or \"zenflow\"") !=
        std::string::npos);
}

TEST_CASE("a rule's optimizer block reads back, sizes the pieces, and a bad one is refused by name") {
  manifest m = sample();
  m.optimizer = {"Lion", {"exp_avg"}};
  m.files[0].size = 48; // 6 elements of master and exp_avg
  m.files[1].size = 48;
  const auto j = m.to_json();
  CHECK(j["optimizer"]["type"] == "Lion");
  const auto back = manifest::parse(j.dump(), "m.json");
  CHECK(back.optimizer == m.optimizer);
  CHECK(back.shard_element_bytes() == 8);
  CHECK(sample().to_json().contains("optimizer") == false); // AdamW's manifests are as before
  auto bad = j;
  bad["files"][0]["size"] = 72; // AdamW's size: the piece no longer tiles the file
  CHECK(!error_of(bad).empty());
  bad = j;
  bad["optimizer"]["state"] = {"exp_avg_sq"};
  CHECK(error_of(bad).find(R"(m.json: optimizer.state: found ["exp_avg_sq"], expected Lion's ["exp_avg"])") !=
        std::string::npos);
  bad = j;
  // A name that is none of zero's is a framework's own rule's, which the engine that loads compares with its own;
  // an empty one, or one with control characters, is refused here.
  bad["optimizer"]["type"] = "LAMB";
  CHECK(error_of(bad).empty());
  bad["optimizer"]["type"] = "";
  CHECK(error_of(bad).find(R"(optimizer.type: found "", expected "AdamW", "Lion", "SGD", "Adagrad", "Lamb" or a )"
                           R"(framework's rule's name (1 to 64 printable characters))") != std::string::npos);
  bad["optimizer"]["type"] = "Sig\nnum";
  CHECK(!error_of(bad).empty());
  bad = j;
  bad["optimizer"]["type"] = "SGD";
  bad["optimizer"]["state"] = nlohmann::json::array();
  bad["files"][0]["size"] = 24;
  bad["files"][1]["size"] = 24;
  CHECK(error_of(bad).empty()); // SGD without momentum: the master alone
}
