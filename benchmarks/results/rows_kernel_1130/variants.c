#include <stddef.h>
typedef float v8 __attribute__((vector_size(32)));
static inline v8 ld(const float *p){ v8 r; __builtin_memcpy(&r, p, 32); return r; }
static inline float hsum(v8 a){ return ((a[0]+a[4])+(a[1]+a[5]))+((a[2]+a[6])+(a[3]+a[7])); }
#ifndef NRMAX
#define NRMAX 4
#endif
#ifndef MRMAX
#define MRMAX 2
#endif
static inline __attribute__((always_inline)) void block(const float *x, long ldx, const float *w, long K,
    const float *b, float *y, long ldy, int NR, int MR, const float *next) {
  v8 a[MRMAX][NRMAX] = {{{0}}};
  long K8 = K & ~7L;
  for (long k = 0; k < K8; k += 8) {
#ifdef PF
    if (next && (k & 15) == 0) for (int j = 0; j < NRMAX; j++) __builtin_prefetch(next + j*K + k + PF);
#endif
    v8 wv[NRMAX];
    for (int j = 0; j < NR; j++) wv[j] = ld(w + j*K + k);
    for (int i = 0; i < MR; i++) { v8 xv = ld(x + i*ldx + k); for (int j = 0; j < NR; j++) a[i][j] += wv[j]*xv; }
  }
  for (int i = 0; i < MR; i++) for (int j = 0; j < NR; j++) {
    float s = hsum(a[i][j]);
    for (long k = K8; k < K; k++) s += w[j*K + k] * x[i*ldx + k];
    y[i*ldy + j] = b ? s + b[j] : s;
  }
}
#define CALL(NR, MR) block(x + m*ldx, ldx, w + n*K, K, b ? b + n : 0, y + m*ldy + n, ldy, NR, MR, (n + NR < N) ? w + (n+NR)*K : 0)
#define BLOCKS(NR) { \
  for (; m + MRMAX <= M; m += MRMAX) CALL(NR, MRMAX); \
  switch (M - m) { case 7: CALL(NR,7); break; case 6: CALL(NR,6); break; case 5: CALL(NR,5); break; case 4: CALL(NR,4); break; \
   case 3: CALL(NR,3); break; case 2: CALL(NR,2); break; case 1: CALL(NR,1); break; default: break; } }
void rows_linear(const float *x, const float *w, const float *b, float *y,
                 long M, long N, long K, long ldx, long ldy, int threads) {
  long NB = (N + NRMAX - 1) / NRMAX;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (long nb = 0; nb < NB; nb++) {
    long n = nb * NRMAX, m = 0; long nr = N - n < NRMAX ? N - n : NRMAX;
    if (nr == NRMAX) BLOCKS(NRMAX) else if (nr == 3) BLOCKS(3) else if (nr == 2) BLOCKS(2) else BLOCKS(1)
  }
}
