// The `--flag VALUE` / `--flag=VALUE` reading that plan and report share.
#include "commands.hpp"

namespace shardlm {

bool option_value(const std::vector<std::string>& args, size_t& i, const std::string& flag, std::string& out) {
  const std::string& a = args[i];
  if (a == flag) {
    if (i + 1 >= args.size()) return false;
    out = args[++i];
    return true;
  }
  if (a.rfind(flag + "=", 0) == 0) {
    out = a.substr(flag.size() + 1);
    return true;
  }
  return false;
}

}  // namespace shardlm
