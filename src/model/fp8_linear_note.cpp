// fp8_linear_note: the start-up line of model.fp8_linear.
#include "fp8_linear_note.hpp"

#include <numeric>

#include "shardlm/core.hpp"

namespace shardlm::model_detail {

int fp8_length_multiple(bool fp8_linear, int attention_multiple) {
  return fp8_linear ? std::lcm(attention_multiple, kFp8SizeMultiple) : attention_multiple;
}

std::string fp8_linear_note(const std::vector<Fp8Linear>& linears, const std::string& also, int max_seq) {
  std::string fp8, wide;
  for (const Fp8Linear& l : linears) {
    std::string& list = l.out % kFp8SizeMultiple == 0 && l.in % kFp8SizeMultiple == 0 ? fp8 : wide;
    list += (list.empty() ? "" : ", ") + (&list == &wide ? concat(l.name, " (", l.out, " x ", l.in, ")") : l.name);
  }
  std::string note = concat(fp8.empty() ? "none" : fp8, " in E4M3 with per-tensor current scaling");
  if (!wide.empty()) note += concat("; 16-bit, sizes not multiples of 16: ", wide);
  if (!also.empty()) note += "; 16-bit: " + also;
  if (max_seq % kFp8SizeMultiple != 0)
    note += concat("; micro-batches padded to data.max_length = ", max_seq,
                   " (not a multiple of 16) run in 16 bits unless their token count is a multiple of 16");
  return note;
}

}  // namespace shardlm::model_detail
