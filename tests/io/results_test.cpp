// Result document pieces: non-finite encoding, table rendering, atomic writes (core/io/results).
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/io/results.hpp"

using namespace mpt;

TEST_CASE("inf and nan round-trip through JSON as strings", "[results]") {
  json v = {{"a", INFINITY}, {"b", -INFINITY}, {"c", NAN}, {"d", 1.5}, {"e", json::array({NAN, 2.0})}};
  json enc = encode_nonfinite(v);
  CHECK(enc["a"] == "inf");
  CHECK(enc["b"] == "-inf");
  CHECK(enc["c"] == "nan");
  CHECK(enc["d"] == 1.5);
  CHECK(enc["e"][0] == "nan");
  json back = json::parse(enc.dump());
  CHECK(std::isinf(decode_nonfinite(back["a"])));
  CHECK(decode_nonfinite(back["b"]) < 0);
  CHECK(std::isnan(decode_nonfinite(back["c"])));
  CHECK(decode_nonfinite(back["d"]) == 1.5);
  CHECK_THROWS_AS(decode_nonfinite(json("infinity")), std::invalid_argument);
}

TEST_CASE("tables: '#' header, units row, right-aligned fixed-width columns", "[results]") {
  Table t{"demo", "Demo table", {text_col("name", "name"), int_col("n", "count", "steps"), sci_col("x", "value"),
                                 pct_col("f", "frac")}};
  t.rows.push_back({{"name", "a"}, {"n", 3}, {"x", 1.5e-11}, {"f", 0.359375}});
  t.rows.push_back({{"name", "long-name"}, {"n", 12345}, {"x", INFINITY}, {"f", 1.0}});
  std::string s = render_table(t);
  std::vector<std::string> lines;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "# Demo table");
  CHECK(lines[1].rfind("#", 0) == 0);
  CHECK(lines[2].find("steps") != std::string::npos);
  CHECK(lines[2].find("%") != std::string::npos);
  CHECK(lines[3].size() == lines[4].size());  // fixed widths
  CHECK(lines[1].size() == lines[3].size());
  CHECK(lines[3].find("1.500e-11") != std::string::npos);
  CHECK(lines[3].find("35.94") != std::string::npos);
  CHECK(lines[4].find("inf") != std::string::npos);
}

TEST_CASE("adaptive precision: %g with the column's significant digits", "[results]") {
  Column c = float_col("x", "x");
  CHECK(format_cell(c, 1.0) == "1");
  CHECK(format_cell(c, 0.000123456) == "0.0001235");
  CHECK(format_cell(c, 123456789.0) == "1.235e+08");
  CHECK(format_cell(c, json()) == "-");
  CHECK(format_cell(c, "nan") == "nan");
}

TEST_CASE("checks: NaN fails, values above tolerance fail", "[results]") {
  Report r;
  r.check("ok", 0.0, 0.0);
  CHECK(r.all_checks_ok());
  r.check("nan", NAN, 1.0);
  CHECK_FALSE(r.all_checks_ok());
  CHECK(render_checks(r.checks).find("FAILED: 1 of 2") != std::string::npos);
}

TEST_CASE("checks: the value column stays aligned when a name is longer than 40 characters", "[results]") {
  Report r;
  r.check("short", 1.0, 2.0);
  r.check(std::string(57, 'n'), 1.0, 2.0);
  const std::string text = render_checks(r.checks);
  // Both rows put their value at the same column: the rows differ only in the name.
  std::vector<std::size_t> at;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find("<=") != std::string::npos) at.push_back(line.find("<="));
  REQUIRE(at.size() == 2);
  CHECK(at[0] == at[1]);
  CHECK(at[0] > 57);
}

TEST_CASE("note_divergence: a note and results.diverged when a loss is not finite, nothing otherwise", "[results]") {
  CHECK(first_nonfinite({1.0, 2.0}) == -1);
  CHECK(first_nonfinite({1.0, INFINITY, NAN}) == 1);
  CHECK(first_nonfinite({}) == -1);
  Report r;
  Table t{"loss", "Loss", {}};
  CHECK_FALSE(note_divergence(r, t, "fine", {2.3, 1.1, 0.7}));
  CHECK(t.notes.empty());
  CHECK_FALSE(r.results.contains("diverged"));  // a run that converges keeps its result unchanged
  CHECK(note_divergence(r, t, "stage0", {2.3, 1e30, NAN, NAN}));
  CHECK(note_divergence(r, t, "fp16", {2.3, -INFINITY}, /*first_step=*/1));
  REQUIRE(t.notes.size() == 2);
  CHECK(t.notes[0].rfind("diverged: stage0's loss became nan at step 2;", 0) == 0);
  CHECK(t.notes[1].rfind("diverged: fp16's loss became -inf at step 2;", 0) == 0);  // counted from 1
  REQUIRE(r.results["diverged"].size() == 2);
  CHECK(r.results["diverged"][0] == json({{"name", "stage0"}, {"table", "loss"}, {"step", 2}, {"loss", "nan"}}));
  CHECK(r.results["diverged"][1]["loss"] == "-inf");
}

TEST_CASE("atomic write: content replaced whole, directories created, no temp left", "[results]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_results_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path = (dir / "sub" / "r.json").string();
  write_file_atomic(path, "first\n");
  write_file_atomic(path, "second\n");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text == "second\n");
  struct stat st{};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  int n = 0;
  for (auto& e : fs::directory_iterator(dir / "sub")) n += 1, (void)e;
  CHECK(n == 1);
  // A target that cannot be written (a directory in the way) throws and leaves it alone.
  fs::create_directories(dir / "blocked");
  CHECK_THROWS(write_file_atomic((dir / "blocked").string(), "x"));
  CHECK(fs::is_directory(dir / "blocked"));
  fs::remove_all(dir);
}

// Issue 15, defect 2: --out onto a symbolic link replaced the link with a regular file (as root,
// --out /dev/stdout made /dev/stdout a regular file), and 0600 results became 0644.
TEST_CASE("atomic write follows symbolic links to their target and keeps the links", "[results]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_results_link_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "real");
  const fs::path target = dir / "real" / "r.json";
  { std::ofstream(target) << "old\n"; }
  fs::create_symlink("real/r.json", dir / "link.json");           // relative target
  fs::create_symlink(dir / "link.json", dir / "link2.json");      // a chain, absolute
  fs::create_symlink("real/new.json", dir / "dangling.json");     // target does not exist yet
  CHECK(check_writable((dir / "link2.json").string()).empty());
  write_file_atomic((dir / "link2.json").string(), "new\n");
  CHECK(fs::is_symlink(dir / "link.json"));
  CHECK(fs::is_symlink(dir / "link2.json"));
  std::ifstream in(target);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text == "new\n");
  write_file_atomic((dir / "dangling.json").string(), "made\n");
  CHECK(fs::is_symlink(dir / "dangling.json"));
  CHECK(fs::is_regular_file(dir / "real" / "new.json"));
  // No temporary or probe file is left in either folder.
  int n = 0;
  for (auto& e : fs::directory_iterator(dir / "real")) n += 1, (void)e;
  CHECK(n == 2);
  // A link to a directory is a directory: an error naming both.
  fs::create_symlink("real", dir / "dirlink");
  CHECK_THROWS_WITH(check_writable((dir / "dirlink").string()), Catch::Contains("is a directory"));
  // A loop of links is an error, not a hang.
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  CHECK_THROWS_WITH(write_file_atomic((dir / "loop_a").string(), "x"), Catch::Contains("too many levels"));
  fs::remove_all(dir);
}

TEST_CASE("atomic write keeps an existing result's permission bits", "[results]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_results_mode_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "r.json").string();
  write_file_atomic(path, "first\n");
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  write_file_atomic(path, "second\n");
  struct stat st{};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  fs::remove_all(dir);
}

TEST_CASE("atomic write into one of our own descriptors by name writes into it", "[results]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  for (const std::string prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::string path = prefix + std::to_string(fds[1]);
    CHECK(check_writable(path).empty());
    write_file_atomic(path, "through the pipe\n");
    char buf[64] = {};
    const ssize_t n = ::read(fds[0], buf, sizeof buf - 1);
    CHECK(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0) == "through the pipe\n");
    struct stat st{};
    REQUIRE(::fstat(fds[1], &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));  // still the pipe, not replaced by a file
  }
  ::close(fds[0]);
  ::close(fds[1]);
}

// Issue 15, defect 11: a failed run left the --out folders it had created behind.
TEST_CASE("check_writable reports the folders it made, remove_created_dirs takes the empty ones away", "[results]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_results_dirs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto made = check_writable((dir / "a" / "b" / "r.json").string());
  REQUIRE(made.size() == 2);
  CHECK(made[0] == (dir / "a").string());
  CHECK(made[1] == (dir / "a" / "b").string());
  remove_created_dirs(made);
  CHECK_FALSE(fs::exists(dir / "a"));
  CHECK(fs::exists(dir));
  // Where a result was written, the folders stay.
  made = check_writable((dir / "c" / "r.json").string());
  write_file_atomic((dir / "c" / "r.json").string(), "x\n");
  remove_created_dirs(made);
  CHECK(fs::exists(dir / "c" / "r.json"));
  fs::remove_all(dir);
}

// Issue 38: "--out DIR/" passed the check (the folder was made for it) and failed after the run.
TEST_CASE("check_writable and write_file_atomic refuse a path that names a folder, and make nothing", "[results]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_results_folder_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const std::string& p : {(dir / "new").string() + "/", (dir / "new" / "x").string() + "/.",
                               (dir / "new" / "x").string() + "/.."}) {
    CHECK_THROWS_WITH(check_writable(p), Catch::Contains(p + ": names a folder") &&
                                             Catch::Contains("expected a file path"));
    CHECK_THROWS_WITH(write_file_atomic(p, "x\n"), Catch::Contains("names a folder"));
    CHECK_FALSE(fs::exists(dir / "new"));
  }
  CHECK_THROWS_WITH(check_writable((dir / "new").string() + "/"), Catch::Contains("(it ends in '/')"));
  fs::remove_all(dir);
}

// Issue 38: a refused --out through a path longer than PATH_MAX left the 20 folders made before
// mkdir(2) said ENAMETOOLONG.
TEST_CASE("check_writable takes away the folders it made when a deeper one cannot be made", "[results]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("mpt_results_long_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path p = dir / "deep";
  for (int i = 0; i < 25; ++i) p /= std::string(200, 'd');  // 25 x 201 characters > PATH_MAX (4096)
  CHECK_THROWS_WITH(check_writable((p / "r.json").string()), Catch::Contains("cannot create directory") &&
                                                                 Catch::Contains("File name too long"));
  CHECK_FALSE(fs::exists(dir / "deep"));
  CHECK_THROWS(write_file_atomic((p / "r.json").string(), "x\n"));
  CHECK_FALSE(fs::exists(dir / "deep"));
  fs::remove_all(dir);
}

TEST_CASE("table_json_by_name keys the rows by their name, a missing or repeated name is refused", "[results]") {
  Table t{"per_n", "Per N", {text_col("name", "N"), float_col("x", "x")}};
  t.rows.push_back({{"name", "n1"}, {"x", 1.0}});
  t.rows.push_back({{"name", "n2"}, {"x", INFINITY}});
  json j = table_json_by_name(t);
  REQUIRE(j.size() == 2);
  CHECK(j["n1"]["x"] == 1.0);
  CHECK(j["n2"]["x"] == "inf");  // non-finite encoded as in table_json
  CHECK(j["n2"]["name"] == "n2");
  t.rows.push_back({{"name", "n1"}, {"x", 3.0}});
  CHECK_THROWS_AS(table_json_by_name(t), std::logic_error);
  t.rows.back() = json{{"x", 3.0}};
  CHECK_THROWS_AS(table_json_by_name(t), std::logic_error);
}

TEST_CASE("Report::add with a Store keeps the table a printed section", "[results]") {
  Report r;
  r.add(Table{"m", "Measured", {text_col("name", "name")}}, Store::Timings);
  REQUIRE(r.sections.size() == 1);
  const Table* t = std::get_if<Table>(&r.sections[0]);
  REQUIRE(t);
  CHECK(t->store == Store::Timings);
  CHECK(render_table(*t).rfind("# Measured\n", 0) == 0);
}
