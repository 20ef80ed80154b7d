/* Shared C helpers for embedlog's Cython modules: big-endian loads and stores,
 * CRC32C (Castagnoli; SSE4.2 three-way interleaved where the CPU has it, a
 * slicing-by-8 table otherwise) and CRC32 (IEEE, slicing-by-8).
 *
 * Hand-written because the hot loops call these per entry from nogil Cython:
 * a Python-level call to a checksum library costs more than the checksum.
 * tests/test_crc.py checks both against google-crc32c and zlib on random
 * buffers of every length 0..4096 and on large ones.
 */
#ifndef EMBEDLOG_NATIVE_H
#define EMBEDLOG_NATIVE_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

/* Readers look entries up in the memtable without a lock while the add path fills it
 * without the GIL: a record and its bytes are written before the slot that publishes
 * them. On x86 stores are seen in program order; this keeps the compiler from moving
 * them (and orders them on weaker CPUs). */
static inline void el_publish(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
static inline uint64_t el_load_acquire(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void el_store_release(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static inline void el_put64(uint8_t *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }
static inline void el_put32(uint8_t *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline uint64_t el_get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
static inline uint32_t el_get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }

#define EL_CRC32C_POLY 0x82F63B78u
#define EL_CRC32_POLY 0xEDB88320u
#define EL_CRC_LONG 8192
#define EL_CRC_SHORT 256

static uint32_t el_crc32c_tab[8][256];
static uint32_t el_crc32_tab[8][256];
static uint32_t el_crc32c_long[4][256];
static uint32_t el_crc32c_short[4][256];
static int el_crc_hw = 0;
static int el_crc_ready = 0;

static void el_make_tables(uint32_t poly, uint32_t tab[8][256]) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
        tab[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = tab[0][n];
        for (int k = 1; k < 8; k++) { c = tab[0][c & 0xff] ^ (c >> 8); tab[k][n] = c; }
    }
}

/* raw register update (no pre/post inversion), slicing-by-8 */
static uint32_t el_crc_sw(uint32_t tab[8][256], uint32_t c, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { c = tab[0][(c ^ *p++) & 0xff] ^ (c >> 8); n--; }
    while (n >= 8) {
        uint64_t w; memcpy(&w, p, 8);
        w ^= c;
        c = tab[7][w & 0xff] ^ tab[6][(w >> 8) & 0xff] ^ tab[5][(w >> 16) & 0xff] ^
            tab[4][(w >> 24) & 0xff] ^ tab[3][(w >> 32) & 0xff] ^ tab[2][(w >> 40) & 0xff] ^
            tab[1][(w >> 48) & 0xff] ^ tab[0][w >> 56];
        p += 8; n -= 8;
    }
    while (n--) c = tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

/* tables for "the register after feeding len zero bytes", a linear map */
static void el_make_shift(uint32_t shift[4][256], size_t len) {
    uint32_t basis[32];
    static const uint8_t zeros[64] = {0};
    for (int i = 0; i < 32; i++) {
        uint32_t c = 1u << i;
        size_t left = len;
        while (left) { size_t k = left < 64 ? left : 64; c = el_crc_sw(el_crc32c_tab, c, zeros, k); left -= k; }
        basis[i] = c;
    }
    for (int b = 0; b < 4; b++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int i = 0; i < 8; i++) if (v & (1u << i)) r ^= basis[b * 8 + i];
            shift[b][v] = r;
        }
}

static inline uint32_t el_shift(uint32_t shift[4][256], uint32_t c) {
    return shift[0][c & 0xff] ^ shift[1][(c >> 8) & 0xff] ^ shift[2][(c >> 16) & 0xff] ^ shift[3][c >> 24];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
__attribute__((target("sse4.2")))
static uint32_t el_crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c0 = crc;
    if (n < 3 * EL_CRC_SHORT) {
        /* short buffers (entry headers, small payloads): unaligned 8-byte steps, no
         * byte-by-byte alignment prologue (unaligned loads cost nothing extra on x86) */
        while (n >= 8) { uint64_t a; memcpy(&a, p, 8); c0 = _mm_crc32_u64(c0, a); p += 8; n -= 8; }
        if (n >= 4) { uint32_t a; memcpy(&a, p, 4); c0 = _mm_crc32_u32((uint32_t)c0, a); p += 4; n -= 4; }
        while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        return (uint32_t)c0;
    }
    while (n && ((uintptr_t)p & 7)) { c0 = _mm_crc32_u8((uint32_t)c0, *p++); n--; }
    while (n >= 3 * EL_CRC_LONG) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + EL_CRC_LONG;
        do {
            uint64_t a, b, d;
            memcpy(&a, p, 8); memcpy(&b, p + EL_CRC_LONG, 8); memcpy(&d, p + 2 * EL_CRC_LONG, 8);
            c0 = _mm_crc32_u64(c0, a); c1 = _mm_crc32_u64(c1, b); c2 = _mm_crc32_u64(c2, d);
            p += 8;
        } while (p < end);
        c0 = el_shift(el_crc32c_long, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = el_shift(el_crc32c_long, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * EL_CRC_LONG; n -= 3 * EL_CRC_LONG;
    }
    while (n >= 3 * EL_CRC_SHORT) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + EL_CRC_SHORT;
        do {
            uint64_t a, b, d;
            memcpy(&a, p, 8); memcpy(&b, p + EL_CRC_SHORT, 8); memcpy(&d, p + 2 * EL_CRC_SHORT, 8);
            c0 = _mm_crc32_u64(c0, a); c1 = _mm_crc32_u64(c1, b); c2 = _mm_crc32_u64(c2, d);
            p += 8;
        } while (p < end);
        c0 = el_shift(el_crc32c_short, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = el_shift(el_crc32c_short, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * EL_CRC_SHORT; n -= 3 * EL_CRC_SHORT;
    }
    while (n >= 8) { uint64_t a; memcpy(&a, p, 8); c0 = _mm_crc32_u64(c0, a); p += 8; n -= 8; }
    while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#define EL_HAVE_HW 1
#else
#define EL_HAVE_HW 0
#endif

static void el_crc_init(void) {
    if (el_crc_ready) return;
    el_make_tables(EL_CRC32C_POLY, el_crc32c_tab);
    el_make_tables(EL_CRC32_POLY, el_crc32_tab);
    el_make_shift(el_crc32c_long, EL_CRC_LONG);
    el_make_shift(el_crc32c_short, EL_CRC_SHORT);
#if EL_HAVE_HW
    __builtin_cpu_init();
    el_crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    el_crc_ready = 1;
}

/* Standard CRC-32C: `crc` is a previous result (0 to start); chains like zlib's crc32. */
static inline uint32_t el_crc32c(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
#if EL_HAVE_HW
    if (el_crc_hw) return ~el_crc32c_hw(c, p, n);
#endif
    return ~el_crc_sw(el_crc32c_tab, c, p, n);
}

/* el_crc32c over src while copying it to dst: one pass over the bytes (the add path). */
#if EL_HAVE_HW
__attribute__((target("sse4.2")))
static uint32_t el_crc32c_copy_hw(uint32_t c, uint8_t *dst, const uint8_t *src, size_t n) {
    uint64_t c0 = c;
    while (n >= 8) {
        uint64_t w; memcpy(&w, src, 8); memcpy(dst, &w, 8);
        c0 = _mm_crc32_u64(c0, w); src += 8; dst += 8; n -= 8;
    }
    while (n--) { *dst = *src; c0 = _mm_crc32_u8((uint32_t)c0, *src++); dst++; }
    return (uint32_t)c0;
}
#endif

static inline uint32_t el_crc32c_copy(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t n) {
#if EL_HAVE_HW
    /* short payloads: one pass; long ones: memcpy and the three-way CRC are faster apart */
    if (el_crc_hw && n < 3 * EL_CRC_SHORT) return ~el_crc32c_copy_hw(~crc, dst, src, n);
#endif
    memcpy(dst, src, n);
    return el_crc32c(crc, dst, n);
}

/* Standard CRC-32 (IEEE, as zlib.crc32 and java.util.zip.CRC32). */
static inline uint32_t el_crc32(uint32_t crc, const uint8_t *p, size_t n) {
    return ~el_crc_sw(el_crc32_tab, ~crc, p, n);
}

#endif
