/* y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for a few rows m: a decode step's linear layers on CPU.
 *
 * Weight-streaming: each weight row is read from memory once per call and used for every input row
 * (up to 4 at a time from L1), while the next block of weight rows is prefetched. Every output is the
 * same sum in the same order whatever the number of rows, the thread count or the ISA (8 float lanes
 * over k with fused multiply-add, then a fixed pairwise sum of the lanes, then the k tail, then the
 * bias): a row's result never depends on its batch. See rows_linear.py. */
#include <stddef.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 r; __builtin_memcpy(&r, p, 32); return r; }
static inline float lanes(v8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

#define NR 2  /* weight rows per block */
#define MR 4  /* input rows per pass */
#define AHEAD 64  /* floats ahead in the next block's rows */

static inline __attribute__((always_inline)) void block(
    const float *x, long ldx, const float *w, long K, const float *b, float *y, long ldy,
    int nr, int mr, const float *next) {
  v8 acc[MR][NR] = {{{0}}};
  long k8 = K & ~7L;
  for (long k = 0; k < k8; k += 8) {
    if (next && (k & 15) == 0)
      for (int j = 0; j < NR; j++) __builtin_prefetch(next + j * K + k + AHEAD);
    v8 wv[NR];
    for (int j = 0; j < nr; j++) wv[j] = load8(w + j * K + k);
    for (int i = 0; i < mr; i++) {
      v8 xv = load8(x + i * ldx + k);
      for (int j = 0; j < nr; j++) acc[i][j] += wv[j] * xv;
    }
  }
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {
      float s = lanes(acc[i][j]);
      for (long k = k8; k < K; k++) s += w[j * K + k] * x[i * ldx + k];
      y[i * ldy + j] = b ? s + b[j] : s;
    }
}

#define AT(nr, mr) block(x + m * ldx, ldx, w + n * K, K, b ? b + n : 0, y + m * ldy + n, ldy, nr, mr, \
                         n + NR < N ? w + (n + NR) * K : 0)
#define ROWS(nr) do { \
    for (; m + MR <= M; m += MR) AT(nr, MR); \
    if (M - m == 3) AT(nr, 3); else if (M - m == 2) AT(nr, 2); else if (M - m == 1) AT(nr, 1); \
  } while (0)

/* x: [M, K] rows ldx apart; w: [N, K] contiguous; b: [N] or NULL; y: [M, N] rows ldy apart. */
void rows_linear(const float *x, const float *w, const float *b, float *y,
                 long M, long N, long K, long ldx, long ldy, int threads) {
  long blocks = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (long nb = 0; nb < blocks; nb++) {
    long n = nb * NR, m = 0;
    if (N - n >= NR) ROWS(NR); else ROWS(1);
  }
}
