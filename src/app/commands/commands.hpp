// app: the subcommands of the shardlm executable.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

// `shardlm train DECK [--section.key=value ...]`; returns the process exit code.
int command_train(const std::vector<std::string>& args);

}  // namespace shardlm
