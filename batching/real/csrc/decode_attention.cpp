// Decode attention straight from the slab KV cache: one query token per row, each row read
// only to its own length, in its own slot (no gather, no padding to the longest row, no mask).
// torch's SDPA over padded slabs reads every row to the group's longest context and runs at
// about half the bandwidth the linear layers stream at on a CPU (see batching/real/attention.py).
//
// q [R, H, D]; kc, vc [S, K, L, D] contiguous; slots, lens [R] int64 -> out [R, H, D].
// Query head h*G + g attends with kv head h (grouped-query attention, G = H / K).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// The float path of every head dim that is a multiple of 16, written with GCC's vector
// extensions (16 floats: one AVX-512 register, two AVX2 ones): the compiler left the plain
// loops' per-position dot products mostly scalar. bf16 widens to fp32 by a shift (bf16 is
// the top half of an fp32).
typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

template <typename T>
static inline v16f load16(const T* p) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    v16h h;
    std::memcpy(&h, p, sizeof(h));
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16f f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  } else {
    v16f f;
    std::memcpy(&f, p, sizeof(f));
    return f;
  }
}

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

// The sum of a vector's lanes as a tree of halves (lane by lane was most of a position's cost).
static inline float hsum(v16f x) {
  v8f a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// One (row, kv head) for T in {float, bf16}, D = 16 * NV, G query heads (at most MAXG).
template <typename T, int NV>
static void one_vec(const T* __restrict qp, const T* __restrict kp, const T* __restrict vp, T* __restrict op,
                    int64_t n, int64_t G, float scale, std::vector<float>& buf) {
  constexpr int D = 16 * NV;
  constexpr int MAXG = 8;
  v16f q[MAXG][NV], acc[MAXG][NV];
  for (int64_t g = 0; g < G; ++g)
    for (int j = 0; j < NV; ++j) {
      q[g][j] = load16(qp + g * D + 16 * j) * scale;
      acc[g][j] = v16f{} ;
    }
  buf.resize(n * G);
  float* __restrict s = buf.data();  // [G, n]: each head's scores contiguous, so exp vectorizes
  float mx[MAXG], sum[MAXG];
  for (int64_t g = 0; g < G; ++g) mx[g] = std::numeric_limits<float>::lowest(), sum[g] = 0;
  for (int64_t l = 0; l < n; ++l) {
    v16f k[NV];
    for (int j = 0; j < NV; ++j) k[j] = load16(kp + l * D + 16 * j);
    for (int64_t g = 0; g < G; ++g) {
      v16f t = q[g][0] * k[0];
      for (int j = 1; j < NV; ++j) t += q[g][j] * k[j];
      const float dot = hsum(t);
      s[g * n + l] = dot;
      mx[g] = std::max(mx[g], dot);
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* __restrict sg = s + g * n;
    const float m = mx[g];
    float z = 0;
    for (int64_t l = 0; l < n; ++l) {
      sg[l] = std::exp(sg[l] - m);
      z += sg[l];
    }
    sum[g] = z;
  }
  for (int64_t l = 0; l < n; ++l) {
    v16f v[NV];
    for (int j = 0; j < NV; ++j) v[j] = load16(vp + l * D + 16 * j);
    for (int64_t g = 0; g < G; ++g) {
      const float p = s[g * n + l];
      for (int j = 0; j < NV; ++j) acc[g][j] += p * v[j];
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const float inv = 1.0f / sum[g];
    for (int j = 0; j < NV; ++j)
      for (int i = 0; i < 16; ++i) op[g * D + 16 * j + i] = T(acc[g][j][i] * inv);
  }
}

// One (row, kv head), any head dim and dtype (float64 included, for the tests' reference):
// plain loops, accumulating in acc_t.
template <typename T>
static void one(const T* __restrict qp, const T* __restrict kp, const T* __restrict vp, T* __restrict op,
                int64_t n, int64_t G, int64_t D, acc_t<T> scale, std::vector<acc_t<T>>& buf) {
  using A = acc_t<T>;
  buf.resize(n * G + 2 * G * D);
  A* __restrict s = buf.data();  // [n, G]
  A* __restrict qf = s + n * G;  // [G, D]
  A* __restrict acc = qf + G * D;
  for (int64_t j = 0; j < G * D; ++j) qf[j] = A(qp[j]) * scale, acc[j] = 0;
  for (int64_t g = 0; g < G; ++g) {
    A mx = std::numeric_limits<A>::lowest(), sum = 0;
    for (int64_t l = 0; l < n; ++l) {
      A dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += qf[g * D + d] * A(kp[l * D + d]);
      s[l * G + g] = dot;
      mx = std::max(mx, dot);
    }
    for (int64_t l = 0; l < n; ++l) sum += (s[l * G + g] = std::exp(s[l * G + g] - mx));
    for (int64_t l = 0; l < n; ++l)
      for (int64_t d = 0; d < D; ++d) acc[g * D + d] += s[l * G + g] * A(vp[l * D + d]);
    for (int64_t d = 0; d < D; ++d) op[g * D + d] = T(acc[g * D + d] / sum);
  }
}

template <typename T, int DD>
static void run(const T* q, const T* kc, const T* vc, const int64_t* slots, const int64_t* lens, T* out,
                int64_t R, int64_t H, int64_t K, int64_t L, int64_t D) {
  using A = acc_t<T>;
  const int64_t G = H / K;
  const A scale = A(1) / std::sqrt(A(D));
  // One (row, kv head) per task: each reads its own keys and values once.
  at::parallel_for(0, R * K, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> buf;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / K, h = i % K;
      const int64_t base = (slots[r] * K + h) * L * D;
      const T* qp = q + (r * H + h * G) * D;
      T* op = out + (r * H + h * G) * D;
      if constexpr (!std::is_same_v<T, double> && DD > 0) {
        if (G <= 8) {
          one_vec<T, DD / 16>(qp, kc + base, vc + base, op, lens[r], G, float(scale), buf);
          continue;
        }
      }
      one<T>(qp, kc + base, vc + base, op, lens[r], G, D, scale, buf);
    }
  });
}

template <typename T>
static void dispatch(const T* q, const T* kc, const T* vc, const int64_t* slots, const int64_t* lens, T* out,
                     int64_t R, int64_t H, int64_t K, int64_t L, int64_t D) {
  switch (D) {
    case 16: return run<T, 16>(q, kc, vc, slots, lens, out, R, H, K, L, D);
    case 32: return run<T, 32>(q, kc, vc, slots, lens, out, R, H, K, L, D);
    case 64: return run<T, 64>(q, kc, vc, slots, lens, out, R, H, K, L, D);
    case 128: return run<T, 128>(q, kc, vc, slots, lens, out, R, H, K, L, D);
    default: return run<T, 0>(q, kc, vc, slots, lens, out, R, H, K, L, D);
  }
}

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor kc, torch::Tensor vc, torch::Tensor slots,
                               torch::Tensor lens) {
  TORCH_CHECK(q.dim() == 3 && kc.dim() == 4 && vc.sizes() == kc.sizes(), "q [R, H, D], kc and vc [S, K, L, D]");
  TORCH_CHECK(q.is_contiguous() && kc.is_contiguous() && vc.is_contiguous(), "contiguous q, kc, vc");
  TORCH_CHECK(q.scalar_type() == kc.scalar_type() && vc.scalar_type() == kc.scalar_type(), "one dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "int64 slots and lens");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), S = kc.size(0), K = kc.size(1), L = kc.size(2);
  TORCH_CHECK(kc.size(3) == D && H % K == 0, "head dims agree, H a multiple of K");
  TORCH_CHECK(slots.numel() == R && lens.numel() == R, "one slot and one length per row");
  auto sl = slots.contiguous(), ln = lens.contiguous();
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t* lp = ln.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(sp[r] >= 0 && sp[r] < S, "slot ", sp[r], " of row ", r, " outside 0..", S - 1);
    TORCH_CHECK(lp[r] >= 1 && lp[r] <= L, "length ", lp[r], " of row ", r, " outside 1..", L);
  }
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "decode_attention", [&] {
    dispatch<scalar_t>(q.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), sp, lp,
                  out.data_ptr<scalar_t>(), R, H, K, L, D);
  });
  return out;
}
