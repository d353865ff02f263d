// The config's enums printed by name, so BOOST_TEST can show the values it compares.
#pragma once

#include <boost/test/unit_test.hpp>

#include <ostream>

#include "shardlm/config.hpp"

namespace shardlm {
inline std::ostream& boost_test_print_type(std::ostream& os, ShardingStrategy s) { return os << strategy_name(s); }
inline std::ostream& boost_test_print_type(std::ostream& os, DType t) { return os << dtype_name(t); }
inline std::ostream& boost_test_print_type(std::ostream& os, DataFormat f) { return os << data_format_name(f); }
inline std::ostream& boost_test_print_type(std::ostream& os, TokenizerSource t) { return os << tokenizer_source_name(t); }
inline std::ostream& boost_test_print_type(std::ostream& os, LrSchedule s) { return os << lr_schedule_name(s); }
inline std::ostream& boost_test_print_type(std::ostream& os, BackwardPrefetch p) { return os << backward_prefetch_name(p); }
inline std::ostream& boost_test_print_type(std::ostream& os, EvalGenerate g) { return os << eval_generate_name(g); }
inline std::ostream& boost_test_print_type(std::ostream& os, ResumeFrom r) { return os << resume_from_name(r); }
inline std::ostream& boost_test_print_type(std::ostream& os, BackendKind b) { return os << backend_name(b); }
inline std::ostream& boost_test_print_type(std::ostream& os, LoraInit i) { return os << lora_init_name(i); }
}  // namespace shardlm
