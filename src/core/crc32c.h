/* crc32c.h: CRC-32C (Castagnoli), the checksum of every checkpoint chunk.
 *
 * The same polynomial as iSCSI, ext4 and TFRecord (0x1EDC6F41, reflected
 * 0x82F63B78), initial value and final xor 0xFFFFFFFF: crc32c("123456789")
 * is 0xE3069283. Uses the SSE4.2 crc32 instruction when the build targets
 * it, and a slicing-by-8 table otherwise; both give the same values. */
#ifndef MT_CORE_CRC32C_H
#define MT_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continue a CRC: crc32c(0, a, n) is the CRC of a; crc32c(crc32c(0, a, n), b, m)
 * is the CRC of a followed by b. */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

/* The table-driven implementation (what crc32c uses without SSE4.2). */
uint32_t crc32c_portable(uint32_t crc, const void *data, size_t len);

#endif
