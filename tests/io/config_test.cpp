// Config schema, merge order and every error path (core/io/config).
#include <cstdio>
#include <fstream>

#include "catch.hpp"
#include "core/io/config.hpp"
#include "core/errors.hpp"

using namespace mpt;

static ConfigSpec spec() {
  ConfigSpec s;
  s.integer("/model/depth", 12, "blocks", 1, 256);
  s.integer("/model/width", 16, "units", 1);
  s.number("/lr", 0.1, "learning rate", 0.0);
  s.boolean("/overlap", true, "overlap");
  s.choice("/precision", "fp16", {"fp16", "bf16"}, "format");
  s.numbers("/scales", {1.0, 65536.0}, "scales", 0.0);
  Param g{ParamType::Number, 2.0, "growth"};
  g.exclusive_min = 1.0;
  s.add("/growth_factor", g);
  return s;
}

static std::string write_tmp(const std::string& text) {
  char name[] = "/tmp/mpt_config_test_XXXXXX";
  int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  std::FILE* f = fdopen(fd, "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return name;
}

static std::string error_of(const ConfigSpec& s, const std::string& file, std::vector<std::string> sets) {
  try {
    resolve_config(s, file, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("defaults, then file, then --set", "[config]") {
  auto s = spec();
  auto file = write_tmp(R"({"model": {"depth": 4}, "lr": 0.5})");
  Config c = resolve_config(s, file, {"model.depth=8", "precision=bf16", "/scales=[2, 4]"});
  CHECK(c.integer("/model/depth") == 8);    // --set wins over the file
  CHECK(c.integer("/model/width") == 16);   // default kept
  CHECK(c.number("/lr") == 0.5);            // from the file
  CHECK(c.str("/precision") == "bf16");     // bare word taken as a string
  CHECK(c.numbers("/scales") == std::vector<double>{2, 4});
  CHECK(c.boolean("/overlap"));
  std::remove(file.c_str());
}

TEST_CASE("a list in a file replaces the default list", "[config]") {
  auto s = spec();
  auto file = write_tmp(R"({"scales": [8]})");
  CHECK(resolve_config(s, file, {}).numbers("/scales") == std::vector<double>{8});
  std::remove(file.c_str());
}

TEST_CASE("errors name the source, the pointer, what was expected and what was found", "[config]") {
  auto s = spec();
  auto unknown = write_tmp(R"({"model": {"dept": 4}})");
  auto e = error_of(s, unknown, {});
  CHECK(e.find(unknown + ": /model/dept: unknown key \"dept\" (did you mean \"depth\"?)") != std::string::npos);

  auto wrong = write_tmp(R"({"model": {"width": "wide"}})");
  CHECK(error_of(s, wrong, {}).find("/model/width: expected an integer >= 1, got a string \"wide\"") != std::string::npos);

  auto range = write_tmp(R"({"model": {"depth": 1000}})");
  CHECK(error_of(s, range, {}).find("/model/depth: expected an integer >= 1 and <= 256, got 1000") != std::string::npos);

  auto obj = write_tmp(R"({"model": 3})");
  CHECK(error_of(s, obj, {}).find("/model: expected an object, got an integer 3") != std::string::npos);

  auto top = write_tmp(R"([1])");
  CHECK(error_of(s, top, {}).find(": /: expected a JSON object at the top level") != std::string::npos);

  auto trunc = write_tmp(R"({"model": {)");
  CHECK(error_of(s, trunc, {}).find(trunc + ": invalid JSON: ") != std::string::npos);

  CHECK(error_of(s, "/nonexistent/x.json", {}).find("/nonexistent/x.json: cannot open the config file") !=
        std::string::npos);
  for (auto* f : {&unknown, &wrong, &range, &obj, &top, &trunc}) std::remove(f->c_str());
}

TEST_CASE("set overrides: errors", "[config]") {
  auto s = spec();
  CHECK(error_of(s, "", {"model.depth"}).find("--set 'model.depth': expected KEY=VALUE") != std::string::npos);
  CHECK(error_of(s, "", {"model.widht=3"}).find("(did you mean \"width\"?)") != std::string::npos);
  CHECK(error_of(s, "", {"precision=fp61"}).find("expected one of \"fp16\", \"bf16\", got \"fp61\" (did you mean \"fp16\"?)") !=
        std::string::npos);
  // Case is no edit: BF16 is bf16 (as typed, two edits from both fp16 and bf16; in lower case none from bf16).
  CHECK(error_of(s, "", {"precision=BF16"}).find("got \"BF16\" (did you mean \"bf16\"?)") != std::string::npos);
  CHECK(nearest("BF16", {"fp16", "bf16"}) == "bf16");
  CHECK(nearest("Depth", {"width", "depth"}) == "depth");
  CHECK(error_of(s, "", {"growth_factor=1"}).find("/growth_factor: expected a number > 1, got 1") != std::string::npos);
  CHECK(error_of(s, "", {"scales=[]"}).find("non-empty") != std::string::npos);
  CHECK(error_of(s, "", {"scales=[1, -2]"}).find("/scales/1: expected a number >= 0, got -2") != std::string::npos);
  CHECK(error_of(s, "", {"overlap=yes"}).find("/overlap: expected a boolean") != std::string::npos);
  CHECK(error_of(s, "", {"model=4"}).find("/model") != std::string::npos);
}

TEST_CASE("integers written as 12.0 are integers, 1.5 is not", "[config]") {
  auto s = spec();
  CHECK(resolve_config(s, "", {"model.depth=12.0"}).integer("/model/depth") == 12);
  // ... and stored as one: --print-config and the result's config echo 12, not 12.0.
  CHECK(resolve_config(s, "", {"model.depth=12.0"}).json_value().at("model").at("depth").dump() == "12");
  CHECK_THROWS_AS(resolve_config(s, "", {"model.depth=1.5"}), ConfigError);
}

TEST_CASE("scalar_or_list parameters read as lists", "[config]") {
  ConfigSpec s;
  Param p{ParamType::Int, 12, "depth", 1.0, 64.0};
  p.scalar_or_list = true;
  s.add("/depth", p);
  CHECK(resolve_config(s, "", {}).integers("/depth") == std::vector<long long>{12});
  CHECK(resolve_config(s, "", {"depth=[4,8]"}).integers("/depth") == std::vector<long long>{4, 8});
  CHECK_THROWS_AS(resolve_config(s, "", {"depth=[4,0]"}), ConfigError);
}

TEST_CASE("suggestions only for near misses", "[config]") {
  CHECK(nearest("dept", {"depth", "width"}) == "depth");
  CHECK(nearest("zzzzzz", {"depth", "width"}).empty());
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("fp61", "fp16") == 1);
}

TEST_CASE("schema misuse is a logic error, not user input", "[config]") {
  ConfigSpec s;
  s.integer("/a", 1, "a");
  CHECK_THROWS_AS(s.integer("/a", 2, "again"), std::logic_error);
  CHECK_THROWS_AS(s.integer("a", 2, "no slash"), std::logic_error);
  Config c = resolve_config(s, "", {});
  CHECK_THROWS_AS(c.integer("/b"), std::logic_error);
}

// --- hostile input (issue 15: defects 3, 4, 11) ---

TEST_CASE("a config read from an endless device stops at the size cap", "[config][hostile]") {
  std::string m = error_of(spec(), "/dev/zero", {});
  CHECK_THAT(m, Catch::Contains("/dev/zero: the config file is larger than 16 MiB"));
  try {
    read_json_file("/dev/zero", "result file", JsonLimits{1 << 20, 8});
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("the result file is larger than 1 MiB"));
  }
}

TEST_CASE("deep nesting is refused while parsing, naming the file and the depth", "[config][hostile]") {
  const std::string deep = "{\"model\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string file = write_tmp(deep);
  std::string m = error_of(spec(), file, {});
  CHECK_THAT(m, Catch::Contains(file + ": nested deeper than 64 levels"));
  std::remove(file.c_str());
  // At the limit it parses (and the message about the wrong type stays short).
  const std::string ok = "{\"model\":{\"depth\":" + std::string(62, '[') + std::string(62, ']') + "}}";
  CHECK_NOTHROW(parse_json_text(ok, "x"));
  m = error_of(spec(), write_tmp(ok), {});
  CHECK_THAT(m, Catch::Contains("/model/depth: expected an integer"));
  CHECK(m.size() < 400);
  m = error_of(spec(), "", {"model.depth=" + std::string(5000, '[') + std::string(5000, ']')});
  CHECK_THAT(m, Catch::Contains("/model/depth: the value is nested deeper than 64 levels"));
}

TEST_CASE("a number below the smallest double is refused where it stands, not read as 0", "[config][hostile]") {
  CHECK_THROWS_WITH(parse_json_text(R"({"a": [1, {"b": 2e-400}]})", "f.json"),
                    Catch::Contains("f.json: /a/1/b: expected a number that is 0 or at least 4.9e-324") &&
                        Catch::Contains("got 2e-400"));
  CHECK_THROWS_WITH(parse_json_text(R"({"a": [0.5, 1, -3.1e-999]})", "f.json"), Catch::Contains("f.json: /a/2: "));
  CHECK_THROWS_WITH(parse_json_text("1e-400", "f.json"), Catch::Contains("f.json: /: "));
  // zero written any way is zero; the smallest denormal is a number
  CHECK(parse_json_text(R"({"a": [0e-999, -0.0, 0.000e5]})", "f.json")["a"][0].get<double>() == 0);
  CHECK(parse_json_text("5e-324", "f.json").get<double>() > 0);
  const std::string m = error_of(spec(), "", {"model.depth=[1e-400]"});
  CHECK_THAT(m, Catch::Contains("/model/depth/0: expected a number that is 0 or at least 4.9e-324"));
}

TEST_CASE("a number beyond double's range is refused where it stands", "[config][hostile]") {
  CHECK_THROWS_WITH(parse_json_text(R"({"a": [1, {"b": 1e309}]})", "f.json"),
                    Catch::Contains("f.json: /a/1/b: expected a number within double's range") &&
                        Catch::Contains("got 1e309"));
  CHECK_THROWS_WITH(parse_json_text(R"({"a": [-1e400]})", "f.json"), Catch::Contains("f.json: /a/0: "));
  const std::string m = error_of(spec(), "", {"model.depth=[1, 1e309]"});
  CHECK_THAT(m, Catch::Contains("/model/depth/1: expected a number within double's range"));
}

TEST_CASE("lists are capped at kMaxListLength elements, named in the error", "[config][hostile]") {
  std::string list = "[1";
  for (std::size_t i = 1; i <= kMaxListLength; ++i) list += ",1";
  list += "]";
  std::string m = error_of(spec(), "", {"scales=" + list});
  CHECK_THAT(m, Catch::Contains("/scales: expected a list of numbers of at most 10000 elements, got a list of 10001"));
}

TEST_CASE("long keys and values are cut in messages, control characters escaped", "[config][hostile]") {
  std::string m = error_of(spec(), "", {std::string(1 << 20, 'k') + "=1"});
  CHECK(m.size() < 1000);
  CHECK_THAT(m, Catch::Contains("(1048578 bytes)"));
  m = error_of(spec(), "", {"precision=" + std::string(1 << 20, 'x')});
  CHECK(m.size() < 1000);
  CHECK_THAT(m, Catch::Contains("(1048576 bytes)"));
  m = error_of(spec(), "", {"\x1b[31mred=1"});
  CHECK_THAT(m, Catch::Contains("unknown key \"\\x1b[31mred\""));
  CHECK(m.find('\x1b') == std::string::npos);
  std::string file = write_tmp("{\"mod\\u0000el\": 1, \"x\": 2}");
  m = error_of(spec(), file, {});
  CHECK_THAT(m, Catch::Contains("/mod\\0el: unknown key \"mod\\0el\" (did you mean \"model\"?)"));
  std::remove(file.c_str());
  CHECK(printable_text("a\x1b[2Jb\x01\x7f\xff\xc2\x9b\t") == "a\\x1b[2Jb\\x01\\x7f\\xff\\u009b\\t");
  CHECK(printable_text("h\xc3\xa9llo", 2) == "h\xc3\xa9\u2026 (6 bytes)");  // cut at a whole character
  // --set text that is not UTF-8 could be neither printed nor stored in the result file.
  m = error_of(spec(), "", {"precision=\xff\xfe"});
  CHECK_THAT(m, Catch::Contains("/precision: expected UTF-8 text"));
}

TEST_CASE("a numeric key segment in --set does not build a huge array", "[config][hostile]") {
  std::string m = error_of(spec(), "", {"model.999999999999=1"});
  CHECK_THAT(m, Catch::Contains("/model/999999999999: unknown key \"999999999999\""));
}

TEST_CASE("limits print exactly, integers beyond long long are refused", "[config][hostile]") {
  ConfigSpec s;
  s.integer("/bytes", 1, "bytes", 1, 1 << 20);
  s.integer("/seed", 1, "seed", 0);
  s.number("/t", 1, "t", 0.1, 3600.5);
  CHECK_THAT(error_of(s, "", {"bytes=2000000"}), Catch::Contains("expected an integer >= 1 and <= 1048576, got 2000000"));
  CHECK_THAT(error_of(s, "", {"t=0"}), Catch::Contains("expected a number >= 0.1 and <= 3600.5, got 0"));
  CHECK_THAT(error_of(s, "", {"seed=18446744073709551615"}), Catch::Contains("at most 9223372036854775807"));
  Config c = resolve_config(s, "", {"seed=9007199254740993"});
  CHECK(c.integer("/seed") == 9007199254740993LL);  // exactly, not through a double
}

TEST_CASE("lists that name rows take each value once: strings with choices always, others when distinct()", "[config]") {
  ConfigSpec s;
  s.strings("/recipes", {"fp32", "bf16"}, {"fp32", "bf16", "fp16"}, "recipes");
  s.integers("/nprocs", {1, 2}, "group sizes", 1);
  s.integers("/hidden", {8, 8}, "widths (may repeat)", 1);
  s.distinct("/nprocs");
  CHECK(error_of(s, "", {}).empty());
  CHECK(error_of(s, "", {"recipes=[\"fp32\",\"bf16\",\"fp32\"]"}).find(
            "/recipes/2: expected each value once, got \"fp32\" again (also /recipes/0)") != std::string::npos);
  CHECK(error_of(s, "", {"nprocs=[2,4,2]"}).find("/nprocs/2: expected each value once, got 2 again (also /nprocs/0)") !=
        std::string::npos);
  CHECK(error_of(s, "", {"hidden=[16,16,16]"}).empty());  // not marked: repeated widths are a model
  CHECK_THROWS_AS(s.distinct("/no/such"), std::logic_error);
}
