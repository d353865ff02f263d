// run_fp8_gemm: each 16-bit operand quantized (fp8_quantize) into the layout cuBLASLt's FP8 GEMM takes,
// A as [M, K] and B as [N, K] with K contiguous, then one GEMM with their inverse scales.
#include "fp8_gemm.hpp"

#include "cuda_check.hpp"
#include "fp8_cast.hpp"
#include "workspace_sizes.hpp"

namespace shardlm::cuda {

Fp8Scratch Fp8Scratch::at(void* base, size_t a_elements, size_t b_elements, size_t slots) {
  char* p = static_cast<char*>(base);
  Fp8Scratch w;
  w.a = reinterpret_cast<uint8_t*>(p), w.a_bytes = a_elements;
  p += align256(a_elements);
  w.g = reinterpret_cast<uint8_t*>(p);
  p += align256(a_elements);
  w.b = reinterpret_cast<uint8_t*>(p), w.b_bytes = b_elements;
  p += align256(b_elements);
  w.a_scale = reinterpret_cast<float*>(p);
  w.b_scale = reinterpret_cast<float*>(p + kFp8ScaleAlignment);
  p += align256(2 * kFp8ScaleAlignment);
  w.amax = reinterpret_cast<unsigned*>(p);
  p += align256(2 * sizeof(unsigned));
  w.saved_amax = reinterpret_cast<unsigned*>(p), w.slots = static_cast<int>(slots);
  return w;
}

void Fp8Buffer::allocate(const Fp8ScratchSize& size) {
  *this = Fp8Buffer();
  if (size.bytes() == 0) return;
  SHARDLM_CHECK(size.kept.empty() || size.kept.size() == size.slots, "FP8 scratch: ", size.kept.size(),
                " kept weights for ", size.slots, " slots");
  buffer_.allocate(size.bytes());
  scratch_ = Fp8Scratch::at(buffer_.data(), size.a, size.b, size.slots);
  size_ = size;
  if (size.kept.empty()) return;
  // After the scratch: the slots' inverse scales, then each slot's transposed weight (and frozen, its copy).
  char* p = buffer_.data() + fp8_scratch_bytes(size.a, size.b, size.slots);
  char* t = p + align256(size.kept.size() * kFp8ScaleAlignment);
  kept_.resize(size.kept.size());
  for (size_t i = 0; i < kept_.size(); ++i) {
    Fp8KeptWeight& k = kept_[i];
    k = {reinterpret_cast<uint8_t*>(t), size.kept[i], reinterpret_cast<float*>(p + i * kFp8ScaleAlignment)};
    t += align256(size.kept[i]);
    if (size.frozen) k.w = reinterpret_cast<uint8_t*>(t), t += align256(size.kept[i]);
  }
  scratch_.kept = kept_.data();
}

bool fp8_gemm_fits(const GemmDesc& d, const Fp8Scratch& w) {
  return !d.fp8 && (d.ab_dtype == DType::BF16 || d.ab_dtype == DType::F16) && d.batch == 1 &&
         (d.epilogue == Epilogue::None || d.epilogue == Epilogue::Bias) && d.M % kFp8SizeMultiple == 0 &&
         d.N % kFp8SizeMultiple == 0 && d.K % kFp8SizeMultiple == 0 && d.ldc * dtype_size(d.c_dtype) % 16 == 0 &&
         static_cast<size_t>(d.M) * d.K <= w.a_bytes && static_cast<size_t>(d.N) * d.K <= w.b_bytes;
}

namespace {

// d in cuBLASLt's FP8 form on copies already made: A [M, K] at a with inverse scale w.a_scale, B^T [N, K]
// at b with b_scale; the forward with fast accumulation (torchao's default), the two gradients with fp32
// promotion.
void run_quantized(Gemm& gemm, const GemmDesc& d, const uint8_t* a, const Fp8Scratch& w, const uint8_t* b,
                   const float* b_scale, cudaStream_t stream) {
  GemmDesc q = d;
  q.fp8 = true;
  q.fast_accum = !d.trans_a && d.trans_b;
  q.trans_a = false, q.trans_b = true;
  q.A = a, q.lda = d.K;
  q.B = b, q.ldb = d.K;
  q.a_scale = w.a_scale, q.b_scale = b_scale;
  gemm.run(q, stream);
}

// op(B) [K, N] of d as B^T [N, K] in w.b: stored [N, K] when trans_b, else [K, N], transposed; its amax
// into *amax, or read from there when `known`.
void quantize_b(const GemmDesc& d, const Fp8Scratch& w, cudaStream_t stream, unsigned* amax, bool known) {
  if (d.trans_b)
    fp8_quantize(d.B, d.N, d.K, d.ldb, d.ab_dtype, w.b, nullptr, w.b_scale, amax, stream, known);
  else
    fp8_quantize(d.B, d.K, d.N, d.ldb, d.ab_dtype, nullptr, w.b, w.b_scale, amax, stream, known);
}

// Slot `slot`'s two amax words (a linear layer's x, then W); null for slot -1.
unsigned* slot_amax(const Fp8Scratch& w, int slot) {
  SHARDLM_CHECK(slot >= -1 && slot < w.slots, "FP8 amax slot ", slot, " outside the scratch's ", w.slots);
  return slot < 0 ? nullptr : w.saved_amax + 2 * slot;
}

// Slot `slot`'s kept W^T when it has one that holds W's out x in elements; null otherwise.
Fp8KeptWeight* kept_weight(const Fp8Scratch& w, int slot, int out, int in) {
  if (slot < 0 || !w.kept) return nullptr;
  Fp8KeptWeight& k = w.kept[slot];
  return k.t && static_cast<size_t>(out) * in <= k.elements ? &k : nullptr;
}

}  // namespace

unsigned* fp8_gemm_a_amax(const Fp8Scratch& w, int slot) {
  unsigned* saved = slot_amax(w, slot);
  return saved ? saved : w.amax;
}

unsigned* fp8_linear_backward_dy_amax(const Fp8Scratch& w) { return w.amax; }

void run_fp8_gemm(Gemm& gemm, const GemmDesc& d, const Fp8Scratch& w, cudaStream_t stream, int slot,
                  bool a_amax_known) {
  SHARDLM_CHECK(fp8_gemm_fits(d, w), "run_fp8_gemm: this GEMM cannot run in FP8 here");
  unsigned* amax = fp8_gemm_a_amax(w, slot);
  // op(A) is [M, K]: stored [M, K] (row stride lda) as it is, or [K, M] when trans_a, transposed.
  if (d.trans_a)
    fp8_quantize(d.A, d.K, d.M, d.lda, d.ab_dtype, nullptr, w.a, w.a_scale, amax, stream, a_amax_known);
  else
    fp8_quantize(d.A, d.M, d.K, d.lda, d.ab_dtype, w.a, nullptr, w.a_scale, amax, stream, a_amax_known);
  // A linear layer's forward (B = W [out, in] as it is) with a kept weight: W^T written beside W's copy
  // (kept too when frozen), or with a frozen one already filled, W not read at all.
  if (Fp8KeptWeight* kept = !d.trans_a && d.trans_b ? kept_weight(w, slot, d.N, d.K) : nullptr) {
    uint8_t* copy = kept->w ? kept->w : w.b;
    if (!kept->filled) {
      fp8_quantize(d.B, d.N, d.K, d.ldb, d.ab_dtype, copy, kept->t, kept->inv_scale, amax + 1, stream);
      kept->filled = kept->w != nullptr;
    }
    run_quantized(gemm, d, w.a, w, copy, kept->inv_scale, stream);
    return;
  }
  quantize_b(d, w, stream, amax + 1, false);
  run_quantized(gemm, d, w.a, w, w.b, w.b_scale, stream);
}

void run_fp8_linear_backward(Gemm& gemm, const GemmDesc* wgrad, const GemmDesc& dgrad, const Fp8Scratch& w,
                             cudaStream_t stream, int slot, bool dy_amax_known) {
  SHARDLM_CHECK(!dgrad.trans_a && fp8_gemm_fits(dgrad, w) &&
                    (!wgrad || (wgrad->trans_a && !wgrad->trans_b && fp8_gemm_fits(*wgrad, w) &&
                                wgrad->A == dgrad.A && wgrad->lda == dgrad.lda && wgrad->M == dgrad.K &&
                                wgrad->K == dgrad.M)),
                "run_fp8_linear_backward: these GEMMs cannot share their output gradient in FP8 here");
  // dy [n, out] (dgrad's A as it is): untransposed into g for dgrad, transposed into a for wgrad.
  fp8_quantize(dgrad.A, dgrad.M, dgrad.K, dgrad.lda, dgrad.ab_dtype, w.g, wgrad ? w.a : nullptr, w.a_scale,
               fp8_linear_backward_dy_amax(w), stream, dy_amax_known);
  // x (wgrad's B) and W (dgrad's B): their amaxes from the forward's slot when there is one.
  unsigned* saved = slot_amax(w, slot);
  if (wgrad) {
    quantize_b(*wgrad, w, stream, saved ? saved : w.amax + 1, saved != nullptr);
    run_quantized(gemm, *wgrad, w.a, w, w.b, w.b_scale, stream);
  }
  // dgrad's B is W [out, in] = [K, N]: the forward's kept W^T when there is one.
  if (const Fp8KeptWeight* kept = kept_weight(w, slot, dgrad.K, dgrad.N)) {
    run_quantized(gemm, dgrad, w.g, w, kept->t, kept->inv_scale, stream);
    return;
  }
  quantize_b(dgrad, w, stream, saved ? saved + 1 : w.amax + 1, saved != nullptr);
  run_quantized(gemm, dgrad, w.g, w, w.b, w.b_scale, stream);
}

}  // namespace shardlm::cuda
