// `shardlm report RUN_DIR... [--csv FILE] [--svg DIR]`: several runs side by side. It only reads
// files, so it runs without MPI (main starts it before MPI_Init).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "commands.hpp"
#include "run_report.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  SHARDLM_CHECK(out, "report: cannot write '", path, "'");
  out << text;
  out.close();
  SHARDLM_CHECK(out, "report: writing '", path, "' failed");
}

}  // namespace

int command_report(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::string csv_path, svg_dir;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (option_value(args, i, "--csv", csv_path) || option_value(args, i, "--svg", svg_dir)) continue;
    if (a.rfind("--", 0) == 0) {
      std::fputs(usage_error("report", concat("unknown or incomplete option '", a, "'")).c_str(), stderr);
      return 2;
    }
    dirs.push_back(a);
  }
  if (dirs.empty()) {
    std::fputs(usage_error("report", args.empty() ? "no run folder given"
                                                  : "no run folder given: RUN_DIR... names the runs to report, "
                                                    "--csv and --svg only say where to write them")
                   .c_str(),
               stderr);
    return 2;
  }
  try {
    std::vector<RunRecord> runs;
    for (const std::string& d : dirs) {
      runs.push_back(read_run(d));
      for (const std::string& w : runs.back().warnings) std::fprintf(stderr, "shardlm: report: warning: %s\n", w.c_str());
    }
    std::fputs(report_markdown(runs).c_str(), stdout);
    if (!csv_path.empty()) {
      write_text(csv_path, report_csv(runs));
      std::printf("\nwrote %s\n", csv_path.c_str());
    }
    if (!svg_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(svg_dir, ec);
      SHARDLM_CHECK(!ec, "report: cannot create '", svg_dir, "': ", ec.message());
      const std::string loss = (std::filesystem::path(svg_dir) / "loss.svg").string();
      const std::string scaling = (std::filesystem::path(svg_dir) / "scaling.svg").string();
      write_text(loss, loss_curves_svg(runs));
      write_text(scaling, scaling_svg(runs));
      std::printf("%swrote %s and %s\n", csv_path.empty() ? "\n" : "", loss.c_str(), scaling.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace shardlm
