// The options of `shardlm comm-test` (nccl-tests' short names too), checked with one message each.
#include <boost/program_options.hpp>
#include <cctype>
#include <sstream>

#include "comm_test.hpp"

namespace shardlm {

namespace po = boost::program_options;

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) items.push_back(item);
  return items;
}

// nccl-tests' type names are accepted beside shardlm's.
DType parse_comm_dtype(const std::string& name) {
  if (name == "float" || name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "half" || name == "float16") return DType::F16;
  try {
    return parse_dtype(name);
  } catch (const Error&) {
    throw Error(concat("--dtype=", name, ": expected fp32, bf16 or fp16"));
  }
}

}  // namespace

const char* comm_test_usage() {
  return "usage: mpirun -np N shardlm comm-test [OPTIONS]\n"
         "\n"
         "Measures all-gather, reduce-scatter, all-reduce and broadcast over a sweep of message sizes on the\n"
         "world, on the ranks of each node (intra) and across nodes (inter), and prints nccl-tests' tables.\n"
         "\n"
         "options:\n"
         "  -b, --min-bytes=N         smallest message (default 8; K, M, G suffixes)\n"
         "  -e, --max-bytes=N         largest message (default 1G; capped to the memory when not given)\n"
         "  -f, --step-factor=F       multiply the size by this integer >= 2 (default 2)\n"
         "  -n, --iters=N             timed iterations per size; the time is their median (default 20)\n"
         "  -w, --warmup=N            untimed iterations before them (default 5)\n"
         "  -c, --check=BOOL          verify one run per size on a data pattern (default true)\n"
         "  -d, --dtype=T             fp32, bf16 or fp16 (default fp32)\n"
         "      --ops=LIST            all_gather,reduce_scatter,all_reduce,broadcast (default: all)\n"
         "      --groups=LIST         world,intra,inter (default: all)\n"
         "      --backend=B           cpu (MPI) or cuda (NCCL on GPU buffers; builds with CUDA only)\n"
         "      --dist.ranks_per_node=K   treat each K consecutive ranks as one node (0: the real hosts)\n"
         "      --dist.timeout=S      seconds an NCCL wait may make no progress before the job ends\n"
         "                            (default SHARDLM_NCCL_TIMEOUT, else 600)\n"
         "      --run.dir=DIR         where comm_test.jsonl goes (default runs/comm-test)\n"
         "  -o, --output=FILE         the JSON lines file instead\n"
         "  -h, --help                print this text\n";
}

size_t parse_byte_count(const std::string& option, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K" || unit == "KB" || unit == "KIB") shift = 10;
  if (unit == "M" || unit == "MB" || unit == "MIB") shift = 20;
  if (unit == "G" || unit == "GB" || unit == "GIB") shift = 30;
  const bool fits = digits > 0 && digits <= 12;  // up to 10^12 before the unit: no overflow
  SHARDLM_CHECK(fits && shift >= 0, option, "=", text, ": expected a byte count such as 8, 64K, 128M or 1G");
  const size_t value = std::stoull(text.substr(0, digits)) << shift;
  SHARDLM_CHECK(value >= 1, option, "=", text, ": must be at least 1 byte");
  return value;
}

CommTestOptions parse_comm_test_options(const std::vector<std::string>& args) {
  CommTestOptions o;
  o.timeout = default_dist_timeout();
  std::string min_bytes, max_bytes, dtype = "fp32", ops, groups;
  po::options_description desc;
  desc.add_options()("help,h", po::bool_switch(&o.help))("min-bytes,b", po::value(&min_bytes))(
      "max-bytes,e", po::value(&max_bytes))("step-factor,f", po::value(&o.step_factor))("iters,n", po::value(&o.iters))(
      "warmup,w", po::value(&o.warmup))("check,c", po::value(&o.check))("dtype,d", po::value(&dtype))(
      "ops", po::value(&ops))("groups", po::value(&groups))("backend", po::value(&o.backend))(
      "dist.ranks_per_node", po::value(&o.ranks_per_node))("dist.timeout", po::value(&o.timeout))("run.dir", po::value(&o.run_dir))(
      "output,o", po::value(&o.output));
  po::variables_map vm;
  try {
    const po::parsed_options parsed = po::command_line_parser(args).options(desc).run();
    // Boost drops words that are no option's value unless told: here they are mistakes.
    for (const po::option& opt : parsed.options)
      if (opt.position_key >= 0)
        throw Error(concat("comm-test: unexpected argument '", opt.value.empty() ? "" : opt.value.front(),
                           "' (options only; see shardlm comm-test --help)"));
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(concat("comm-test: ", e.what(), " (see shardlm comm-test --help)"));
  }
  if (o.help) return o;
  if (vm.count("min-bytes")) o.min_bytes = parse_byte_count("--min-bytes", min_bytes);
  if (vm.count("max-bytes")) {
    o.max_bytes = parse_byte_count("--max-bytes", max_bytes);
    o.max_bytes_given = true;
  }
  SHARDLM_CHECK(o.min_bytes <= o.max_bytes, "--min-bytes=", o.min_bytes, " is larger than --max-bytes=", o.max_bytes);
  SHARDLM_CHECK(o.step_factor >= 2, "--step-factor=", o.step_factor, ": must be an integer >= 2");
  SHARDLM_CHECK(o.iters >= 1, "--iters=", o.iters, ": must be >= 1");
  SHARDLM_CHECK(o.warmup >= 0, "--warmup=", o.warmup, ": must be >= 0");
  SHARDLM_CHECK(o.ranks_per_node >= 0, "--dist.ranks_per_node=", o.ranks_per_node, ": must be >= 0");
  SHARDLM_CHECK(o.timeout > 0, "--dist.timeout=", o.timeout, ": must be > 0 seconds");
  SHARDLM_CHECK(o.backend == "cpu" || o.backend == "cuda", "--backend=", o.backend, ": expected cpu or cuda");
  o.dtype = parse_comm_dtype(dtype);
  if (vm.count("ops") && ops != "all") {
    o.collectives.clear();
    for (const std::string& name : split_list(ops)) {
      try {
        o.collectives.push_back(parse_collective(name));
      } catch (const Error& e) {
        throw Error(concat("--ops: ", e.what()));
      }
    }
    SHARDLM_CHECK(!o.collectives.empty(), "--ops is empty: name at least one of all_gather, reduce_scatter, "
                                          "all_reduce, broadcast");
  }
  if (vm.count("groups") && groups != "all") {
    o.groups = split_list(groups);
    for (const std::string& g : o.groups)
      SHARDLM_CHECK(g == "world" || g == "intra" || g == "inter", "--groups: unknown group '", g,
                    "' (expected world, intra or inter)");
    SHARDLM_CHECK(!o.groups.empty(), "--groups is empty: name at least one of world, intra, inter");
  }
  return o;
}

}  // namespace shardlm
