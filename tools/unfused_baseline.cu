// Unfused baseline: gather, cublasGemmGroupedBatchedEx, SwiGLU, combine; backward with the same pieces.
#include "unfused_baseline.hpp"

#include "mok/reference/error.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace mok::bench {
namespace {

#define CK(x)                                                                                           \
  do {                                                                                                  \
    cudaError_t e_ = (x);                                                                               \
    if (e_ != cudaSuccess) throw Error(std::string(#x ": ") + cudaGetErrorString(e_), ErrorKind::kInternal); \
  } while (0)
#define CB(x)                                                                                           \
  do {                                                                                                  \
    cublasStatus_t s_ = (x);                                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                    \
      throw Error(std::string(#x ": cuBLAS status ") + std::to_string(static_cast<int>(s_)), ErrorKind::kInternal); \
  } while (0)

using bf16 = __nv_bfloat16;

__device__ float silu(float v) { return v / (1.0f + __expf(-v)); }

__global__ void gather_rows(const bf16* src, const int* token, bf16* dst, int64_t rows, int64_t H) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) dst[r * H + h] = src[token[r] * H + h];
}

__global__ void swiglu(const bf16* g, const bf16* u, bf16* a, int64_t n) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    a[i] = __float2bfloat16(silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
}

__global__ void swiglu_backward(const bf16* da, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t n) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float x = __bfloat162float(g[i]), s = 1.0f / (1.0f + __expf(-x)), d = __bfloat162float(da[i]);
    dg[i] = __float2bfloat16(d * __bfloat162float(u[i]) * s * (1.0f + x * (1.0f - s)));
    du[i] = __float2bfloat16(d * x * s);
  }
}

// out[t, h] = shared[t, h] + sum_k w[t, k] * rows[row_of[t*K+k], h]  (row_of = -1: empty slot)
__global__ void combine(const bf16* rows, const int* row_of, const float* w, const float* shared, bf16* out,
                        int64_t T, int64_t K, int64_t H) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < T * H; i += gridDim.x * blockDim.x) {
    const int64_t t = i / H, h = i % H;
    float acc = shared ? shared[i] : 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const int r = row_of[t * K + k];
      if (r >= 0) acc += (w ? w[t * K + k] : 1.0f) * __bfloat162float(rows[r * H + h]);
    }
    out[i] = __float2bfloat16(acc);
  }
}

__global__ void scale_rows(const bf16* d_out, const int* token, const float* w_row, bf16* dy, int64_t rows, int64_t H) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
      dy[r * H + h] = __float2bfloat16(w_row[r] * __bfloat162float(d_out[token[r] * H + h]));
}

__global__ void router_grad(const bf16* d_out, const bf16* y, const int* row_of, float* d_rw, int64_t T, int64_t K,
                            int64_t H) {
  const int lane = threadIdx.x % 32;
  for (int64_t s = (blockIdx.x * blockDim.x + threadIdx.x) / 32; s < T * K; s += gridDim.x * blockDim.x / 32) {
    const int r = row_of[s];
    float acc = 0.0f;
    if (r >= 0)
      for (int64_t h = lane; h < H; h += 32) acc += __bfloat162float(d_out[(s / K) * H + h]) * __bfloat162float(y[r * H + h]);
    for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) d_rw[s] = acc;
  }
}

template <class T>
T* dalloc(std::vector<void*>& owned, int64_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
  owned.push_back(p);
  return static_cast<T*>(p);
}

// One grouped GEMM (one group per expert with rows), column-major as cuBLAS sees it:
// C_e (m x n_e) = alpha op(A_e) op(B_e) + beta C_e. Arrays are built once and reused.
struct Grouped {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  void** a = nullptr;  // device arrays of per-expert pointers
  void** b = nullptr;
  void** c = nullptr;
  cudaDataType_t c_type = CUDA_R_16BF;
  // Host copies of the per-expert pointers, for the per-expert fallback.
  std::vector<const void*> ha, hb;
  std::vector<void*> hc;
  // One grouped call; where this cuBLAS refuses the type combination (seen on the H200 with
  // cuBLAS 13.0: CUBLAS_STATUS_NOT_SUPPORTED), one cublasGemmEx per expert instead.
  void run(cublasHandle_t h) const {
    if (m.empty()) return;
    if (!per_expert) {
      const cublasStatus_t st = cublasGemmGroupedBatchedEx(
          h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), a, CUDA_R_16BF, lda.data(), b,
          CUDA_R_16BF, ldb.data(), beta.data(), c, c_type, ldc.data(), static_cast<int>(m.size()), size.data(),
          CUBLAS_COMPUTE_32F);
      if (st == CUBLAS_STATUS_SUCCESS) return;
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) CB(st);
      per_expert = true;
    }
    for (size_t g = 0; g < m.size(); ++g)
      CB(cublasGemmEx(h, ta[g], tb[g], m[g], n[g], k[g], &alpha[g], ha[g], CUDA_R_16BF, lda[g], hb[g], CUDA_R_16BF,
                      ldb[g], &beta[g], hc[g], c_type, ldc[g], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  mutable bool per_expert = false;
};

}  // namespace

struct UnfusedBaseline::Impl {
  spec::LayerConfig cfg;
  cublasHandle_t handle{};
  std::vector<void*> owned;
  int64_t rows = 0;
  // inputs
  bf16 *x, *wg, *wu, *wd, *wsg = nullptr, *wsu = nullptr, *wsd = nullptr, *dout;
  float* rw;
  // layout
  int *token, *row_of;
  float* w_row;
  // forward buffers
  bf16 *xs, *g, *u, *act, *y, *out, *sg = nullptr, *su = nullptr, *sa = nullptr;
  float* s = nullptr;
  // backward buffers
  bf16 *dy, *da, *dg, *du, *dxr, *dx, *sda = nullptr, *sdg = nullptr, *sdu = nullptr;
  float *drw, *dwg, *dwu, *dwd, *dxs = nullptr, *dwsg = nullptr, *dwsu = nullptr, *dwsd = nullptr;
  Grouped gate, up, down, d_act, dx_gate, dx_up, w_gate, w_up, w_down;

  ~Impl() {
    if (handle) cublasDestroy(handle);
    for (void* p : owned) cudaFree(p);
  }

  // Plain GEMM for the shared expert (column-major).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16* A, int lda, const bf16* B,
            int ldb, float beta, void* C, cudaDataType_t ct, int ldc) {
    const float alpha = 1.0f;
    CB(cublasGemmEx(handle, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C, ct, ldc,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

UnfusedBaseline::UnfusedBaseline(const spec::LayerConfig& cfg, const ref::TensorMap& inputs)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = cfg;
  CB(cublasCreate(&m.handle));
  const int64_t G = cfg.num_tokens(), H = cfg.hidden, I = cfg.intermediate, Is = cfg.shared_intermediate,
                E = cfg.num_experts, K = cfg.top_k;
  auto up = [&](const char* p) -> void* {
    const ref::Tensor& t = ref::at(inputs, p);
    void* d = dalloc<uint8_t>(m.owned, static_cast<int64_t>(t.size_bytes()));
    CK(cudaMemcpy(d, t.raw(), t.size_bytes(), cudaMemcpyHostToDevice));
    return d;
  };
  m.x = static_cast<bf16*>(up("inputs/x"));
  m.wg = static_cast<bf16*>(up("inputs/w_routed_gate"));
  m.wu = static_cast<bf16*>(up("inputs/w_routed_up"));
  m.wd = static_cast<bf16*>(up("inputs/w_routed_down"));
  m.dout = static_cast<bf16*>(up("inputs/d_output"));
  m.rw = static_cast<float*>(up("inputs/router_weights"));
  if (Is > 0) {
    m.wsg = static_cast<bf16*>(up("inputs/w_shared_gate"));
    m.wsu = static_cast<bf16*>(up("inputs/w_shared_up"));
    m.wsd = static_cast<bf16*>(up("inputs/w_shared_down"));
  }
  // Layout: rows sorted by expert (stable in token, slot order).
  const int32_t* tk = ref::at(inputs, "inputs/topk_experts").data<int32_t>();
  const float* w = ref::at(inputs, "inputs/router_weights").data<float>();
  std::vector<int64_t> count(E, 0);
  for (int64_t i = 0; i < G * K; ++i)
    if (tk[i] >= 0) ++count[tk[i]];
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) start[e + 1] = start[e] + count[e];
  m.rows = start[E];
  std::vector<int> token(m.rows), row_of(G * K, -1);
  std::vector<float> w_row(m.rows);
  std::vector<int64_t> cursor(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < G * K; ++i) {
    if (tk[i] < 0) continue;
    const int64_t r = cursor[tk[i]]++;
    token[r] = static_cast<int>(i / K);
    w_row[r] = w[i];
    row_of[i] = static_cast<int>(r);
  }
  m.token = dalloc<int>(m.owned, m.rows);
  m.row_of = dalloc<int>(m.owned, G * K);
  m.w_row = dalloc<float>(m.owned, m.rows);
  CK(cudaMemcpy(m.token, token.data(), m.rows * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(m.row_of, row_of.data(), G * K * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(m.w_row, w_row.data(), m.rows * sizeof(float), cudaMemcpyHostToDevice));
  const int64_t R = m.rows;
  m.xs = dalloc<bf16>(m.owned, R * H);
  m.g = dalloc<bf16>(m.owned, R * I);
  m.u = dalloc<bf16>(m.owned, R * I);
  m.act = dalloc<bf16>(m.owned, R * I);
  m.y = dalloc<bf16>(m.owned, R * H);
  m.out = dalloc<bf16>(m.owned, G * H);
  m.dy = dalloc<bf16>(m.owned, R * H);
  m.da = dalloc<bf16>(m.owned, R * I);
  m.dg = dalloc<bf16>(m.owned, R * I);
  m.du = dalloc<bf16>(m.owned, R * I);
  m.dxr = dalloc<bf16>(m.owned, R * H);
  m.dx = dalloc<bf16>(m.owned, G * H);
  m.drw = dalloc<float>(m.owned, G * K);
  m.dwg = dalloc<float>(m.owned, E * I * H);
  m.dwu = dalloc<float>(m.owned, E * I * H);
  m.dwd = dalloc<float>(m.owned, E * I * H);
  if (Is > 0) {
    m.sg = dalloc<bf16>(m.owned, G * Is);
    m.su = dalloc<bf16>(m.owned, G * Is);
    m.sa = dalloc<bf16>(m.owned, G * Is);
    m.s = dalloc<float>(m.owned, G * H);
    m.sda = dalloc<bf16>(m.owned, G * Is);
    m.sdg = dalloc<bf16>(m.owned, G * Is);
    m.sdu = dalloc<bf16>(m.owned, G * Is);
    m.dxs = dalloc<float>(m.owned, G * H);
    m.dwsg = dalloc<float>(m.owned, Is * H);
    m.dwsu = dalloc<float>(m.owned, Is * H);
    m.dwsd = dalloc<float>(m.owned, Is * H);
  }
  // Grouped GEMMs, column-major views of row-major data: a row-major [r, c] matrix is a
  // column-major [c, r] one with leading dimension c.
  auto build = [&](Grouped& gm, cublasOperation_t ta, cublasOperation_t tb, auto dims, auto ptrs, float beta,
                   cudaDataType_t ct) {
    std::vector<const void*> a, b;
    std::vector<void*> c;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n_e = count[e], r0 = start[e];
      if (n_e == 0) continue;
      int mm, nn, kk, la, lb, lc;
      dims(n_e, mm, nn, kk, la, lb, lc);
      const void* pa;
      const void* pb;
      void* pc;
      ptrs(e, r0, pa, pb, pc);
      gm.ta.push_back(ta);
      gm.tb.push_back(tb);
      gm.m.push_back(mm);
      gm.n.push_back(nn);
      gm.k.push_back(kk);
      gm.lda.push_back(la);
      gm.ldb.push_back(lb);
      gm.ldc.push_back(lc);
      gm.size.push_back(1);
      gm.alpha.push_back(1.0f);
      gm.beta.push_back(beta);
      a.push_back(pa);
      b.push_back(pb);
      c.push_back(pc);
    }
    gm.c_type = ct;
    gm.ha = a;
    gm.hb = b;
    gm.hc = c;
    gm.a = dalloc<void*>(m.owned, static_cast<int64_t>(a.size()));
    gm.b = dalloc<void*>(m.owned, static_cast<int64_t>(b.size()));
    gm.c = dalloc<void*>(m.owned, static_cast<int64_t>(c.size()));
    CK(cudaMemcpy(gm.a, a.data(), a.size() * sizeof(void*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(gm.b, b.data(), b.size() * sizeof(void*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(gm.c, c.data(), c.size() * sizeof(void*), cudaMemcpyHostToDevice));
  };
  const auto N = CUBLAS_OP_N, Tr = CUBLAS_OP_T;
  const int h = static_cast<int>(H), i = static_cast<int>(I);
  // g_e [n_e, I] = xs_e [n_e, H] W_gate[e]^T: column-major C [I, n_e] = W^T(op T of [H, I]) * xs [H, n_e]
  auto dims_gu = [&](int64_t n_e, int& mm, int& nn, int& kk, int& la, int& lb, int& lc) {
    mm = i; nn = static_cast<int>(n_e); kk = h; la = h; lb = h; lc = i; };
  build(m.gate, Tr, N, dims_gu, [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.wg + e * I * H; b = m.xs + r0 * H; c = m.g + r0 * I; }, 0.0f, CUDA_R_16BF);
  build(m.up, Tr, N, dims_gu, [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.wu + e * I * H; b = m.xs + r0 * H; c = m.u + r0 * I; }, 0.0f, CUDA_R_16BF);
  // y_e [n_e, H] = act_e [n_e, I] W_down[e]^T: C [H, n_e] = (W_down col-major [I, H])^T * act [I, n_e]
  build(m.down, Tr, N, [&](int64_t n_e, int& mm, int& nn, int& kk, int& la, int& lb, int& lc) {
    mm = h; nn = static_cast<int>(n_e); kk = i; la = i; lb = i; lc = h; },
    [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.wd + e * H * I; b = m.act + r0 * I; c = m.y + r0 * H; }, 0.0f, CUDA_R_16BF);
  // da_e [n_e, I] = dy_e [n_e, H] W_down[e]: C [I, n_e] = (W_down col-major [I, H]) * dy [H, n_e]
  build(m.d_act, N, N, [&](int64_t n_e, int& mm, int& nn, int& kk, int& la, int& lb, int& lc) {
    mm = i; nn = static_cast<int>(n_e); kk = h; la = i; lb = h; lc = i; },
    [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.wd + e * H * I; b = m.dy + r0 * H; c = m.da + r0 * I; }, 0.0f, CUDA_R_16BF);
  // dx_e [n_e, H] = dg_e W_gate[e] + du_e W_up[e]: C [H, n_e] = (W col-major [H, I]) * dg [I, n_e]
  auto dims_dx = [&](int64_t n_e, int& mm, int& nn, int& kk, int& la, int& lb, int& lc) {
    mm = h; nn = static_cast<int>(n_e); kk = i; la = h; lb = i; lc = h; };
  build(m.dx_gate, N, N, dims_dx, [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.wg + e * I * H; b = m.dg + r0 * I; c = m.dxr + r0 * H; }, 0.0f, CUDA_R_16BF);
  build(m.dx_up, N, N, dims_dx, [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.wu + e * I * H; b = m.du + r0 * I; c = m.dxr + r0 * H; }, 1.0f, CUDA_R_16BF);
  // dW_gate[e] [I, H] = dg_e^T xs_e: C [H, I] = xs [H, n_e] * dg^T (op T of [I, n_e])
  auto dims_wg = [&](int64_t n_e, int& mm, int& nn, int& kk, int& la, int& lb, int& lc) {
    mm = h; nn = i; kk = static_cast<int>(n_e); la = h; lb = i; lc = h; };
  build(m.w_gate, N, Tr, dims_wg, [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.xs + r0 * H; b = m.dg + r0 * I; c = m.dwg + e * I * H; }, 0.0f, CUDA_R_32F);
  build(m.w_up, N, Tr, dims_wg, [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.xs + r0 * H; b = m.du + r0 * I; c = m.dwu + e * I * H; }, 0.0f, CUDA_R_32F);
  // dW_down[e] [H, I] = dy_e^T act_e: C [I, H] = act [I, n_e] * dy^T (op T of [H, n_e])
  build(m.w_down, N, Tr, [&](int64_t n_e, int& mm, int& nn, int& kk, int& la, int& lb, int& lc) {
    mm = i; nn = h; kk = static_cast<int>(n_e); la = i; lb = h; lc = i; },
    [&](int64_t e, int64_t r0, const void*& a, const void*& b, void*& c) {
    a = m.act + r0 * I; b = m.dy + r0 * H; c = m.dwd + e * H * I; }, 0.0f, CUDA_R_32F);
}

UnfusedBaseline::~UnfusedBaseline() = default;

void UnfusedBaseline::forward() {
  Impl& m = *impl_;
  const spec::LayerConfig& c = m.cfg;
  const int64_t G = c.num_tokens(), H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, K = c.top_k;
  gather_rows<<<static_cast<unsigned>(std::min<int64_t>(m.rows, 65535) + (m.rows == 0)), 256>>>(m.x, m.token, m.xs, m.rows, H);
  m.gate.run(m.handle);
  m.up.run(m.handle);
  swiglu<<<1024, 256>>>(m.g, m.u, m.act, m.rows * I);
  m.down.run(m.handle);
  if (Is > 0) {
    const int h = static_cast<int>(H), is = static_cast<int>(Is), t = static_cast<int>(G);
    m.gemm(CUBLAS_OP_T, CUBLAS_OP_N, is, t, h, m.wsg, h, m.x, h, 0.0f, m.sg, CUDA_R_16BF, is);
    m.gemm(CUBLAS_OP_T, CUBLAS_OP_N, is, t, h, m.wsu, h, m.x, h, 0.0f, m.su, CUDA_R_16BF, is);
    swiglu<<<1024, 256>>>(m.sg, m.su, m.sa, G * Is);
    m.gemm(CUBLAS_OP_T, CUBLAS_OP_N, h, t, is, m.wsd, is, m.sa, is, 0.0f, m.s, CUDA_R_32F, h);
  }
  combine<<<1024, 256>>>(m.y, m.row_of, m.rw, m.s, m.out, G, K, H);
  CK(cudaGetLastError());
}

void UnfusedBaseline::backward() {
  Impl& m = *impl_;
  const spec::LayerConfig& c = m.cfg;
  const int64_t G = c.num_tokens(), H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, K = c.top_k;
  scale_rows<<<static_cast<unsigned>(std::min<int64_t>(m.rows, 65535) + (m.rows == 0)), 256>>>(m.dout, m.token, m.w_row, m.dy, m.rows, H);
  router_grad<<<1024, 256>>>(m.dout, m.y, m.row_of, m.drw, G, K, H);
  m.d_act.run(m.handle);
  swiglu_backward<<<1024, 256>>>(m.da, m.g, m.u, m.dg, m.du, m.rows * I);
  m.dx_gate.run(m.handle);
  m.dx_up.run(m.handle);
  m.w_gate.run(m.handle);
  m.w_up.run(m.handle);
  m.w_down.run(m.handle);
  if (Is > 0) {
    const int h = static_cast<int>(H), is = static_cast<int>(Is), t = static_cast<int>(G);
    m.gemm(CUBLAS_OP_N, CUBLAS_OP_N, is, t, h, m.wsd, is, m.dout, h, 0.0f, m.sda, CUDA_R_16BF, is);
    swiglu_backward<<<1024, 256>>>(m.sda, m.sg, m.su, m.sdg, m.sdu, G * Is);
    m.gemm(CUBLAS_OP_N, CUBLAS_OP_N, h, t, is, m.wsg, h, m.sdg, is, 0.0f, m.dxs, CUDA_R_32F, h);
    m.gemm(CUBLAS_OP_N, CUBLAS_OP_N, h, t, is, m.wsu, h, m.sdu, is, 1.0f, m.dxs, CUDA_R_32F, h);
    m.gemm(CUBLAS_OP_N, CUBLAS_OP_T, h, is, t, m.x, h, m.sdg, is, 0.0f, m.dwsg, CUDA_R_32F, h);
    m.gemm(CUBLAS_OP_N, CUBLAS_OP_T, h, is, t, m.x, h, m.sdu, is, 0.0f, m.dwsu, CUDA_R_32F, h);
    m.gemm(CUBLAS_OP_N, CUBLAS_OP_T, is, h, t, m.sa, is, m.dout, h, 0.0f, m.dwsd, CUDA_R_32F, is);
  }
  combine<<<1024, 256>>>(m.dxr, m.row_of, nullptr, m.dxs, m.dx, G, K, H);
  CK(cudaGetLastError());
}

const char* UnfusedBaseline::gemm_path() const { return impl_->gate.per_expert ? "per-expert cublasGemmEx" : "cublasGemmGroupedBatchedEx"; }

ref::Tensor UnfusedBaseline::output() const {
  const spec::LayerConfig& c = impl_->cfg;
  ref::Tensor t(ref::DType::kBf16, {c.num_tokens(), c.hidden});
  CK(cudaMemcpy(t.raw(), impl_->out, t.size_bytes(), cudaMemcpyDeviceToHost));
  return t;
}

}  // namespace mok::bench
