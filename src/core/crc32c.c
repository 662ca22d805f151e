/* crc32c.c: CRC-32C with the SSE4.2 instruction when available, else
 * slicing-by-8 over tables built once (thread-safe: pthread_once). */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_build(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++) crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xff];
}

uint32_t crc32c_portable(uint32_t crc, const void *data, size_t len) {
    pthread_once(&crc_table_once, crc_table_build);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= c; /* little-endian: the low 4 bytes meet the running CRC */
        c = crc_table[7][word & 0xff] ^ crc_table[6][(word >> 8) & 0xff] ^ crc_table[5][(word >> 16) & 0xff] ^
            crc_table[4][(word >> 24) & 0xff] ^ crc_table[3][(word >> 32) & 0xff] ^
            crc_table[2][(word >> 40) & 0xff] ^ crc_table[1][(word >> 48) & 0xff] ^ crc_table[0][word >> 56];
        p += 8;
        len -= 8;
    }
    while (len-- > 0) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return ~c;
}

uint32_t crc32c(uint32_t crc, const void *data, size_t len) {
#if defined(__SSE4_2__)
    const unsigned char *p = data;
    uint64_t c = ~crc;
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        len -= 8;
    }
    while (len-- > 0) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
#else
    return crc32c_portable(crc, data, len);
#endif
}
