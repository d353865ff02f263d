// bench_tokenizer_json: writes the tokenizer.json of a SentencePiece BPE model (Llama 2's
// tokenizer.model, as transformers' LlamaTokenizerFast converts it), for benchmarks that need a real
// subword tokenizer where no tokenizer.json can be downloaded (bench/packing_compare.sh).
//
//   build/bin/bench_tokenizer_json MODEL OUT_JSON
#include <cstdio>
#include <fstream>
#include <string>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_tokenizer_json TOKENIZER_MODEL OUT_JSON\n");
    return 2;
  }
  try {
    const std::string json = shardlm::sentencepiece_to_tokenizer_json(argv[1]);
    std::ofstream out(argv[2], std::ios::binary);
    out << json;
    out.close();
    if (!out) throw shardlm::Error(shardlm::concat("cannot write ", argv[2]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer_json: %s\n", e.what());
    return 1;
  }
  return 0;
}
