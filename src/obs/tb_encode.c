/* tb_encode.c: TFRecord framing and the Event / Summary protobuf encoding of
 * TensorBoard scalars (see tb_encode.h), written by hand: varints,
 * little-endian fixed64 / fixed32 and length-delimited fields. */
#include "tb_encode.h"

#include <string.h>

#include "../core/crc32c.h"

uint32_t tb_masked_crc32c(const void *data, size_t len) {
    uint32_t crc = crc32c(0, data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* A small append buffer; `ok` turns false on the first write that does not fit. */
typedef struct Buf {
    uint8_t *p;
    size_t len, cap;
    int ok;
} Buf;

static void put_bytes(Buf *b, const void *data, size_t n) {
    if (!b->ok || n > b->cap - b->len) {
        b->ok = 0;
        return;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_varint(Buf *b, uint64_t v) {
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) tmp[n] |= 0x80;
        n++;
    } while (v);
    put_bytes(b, tmp, n);
}

static void put_le(Buf *b, uint64_t v, int bytes) {
    uint8_t tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    put_bytes(b, tmp, (size_t)bytes);
}

static void put_double_field(Buf *b, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_varint(b, (uint64_t)field << 3 | 1);
    put_le(b, bits, 8);
}

static void put_float_field(Buf *b, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_varint(b, (uint64_t)field << 3 | 5);
    put_le(b, bits, 4);
}

static void put_bytes_field(Buf *b, int field, const void *data, size_t n) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put_bytes(b, data, n);
}

size_t tb_encode_file_version_event(uint8_t *out, size_t cap, double wall_time) {
    static const char version[] = "brain.Event:2";
    Buf b = {out, 0, cap, 1};
    put_double_field(&b, 1, wall_time);
    put_bytes_field(&b, 3, version, sizeof version - 1);
    return b.ok ? b.len : 0;
}

size_t tb_encode_session_start_event(uint8_t *out, size_t cap, double wall_time, int64_t step) {
    const uint8_t session_log[] = {1 << 3 | 0, 1}; /* status = START */
    Buf b = {out, 0, cap, 1};
    put_double_field(&b, 1, wall_time);
    put_varint(&b, 2 << 3 | 0);
    put_varint(&b, (uint64_t)step);
    put_bytes_field(&b, 7, session_log, sizeof session_log);
    return b.ok ? b.len : 0;
}

size_t tb_encode_scalar_event(uint8_t *out, size_t cap, double wall_time, int64_t step, const char *tag,
                              float value) {
    const size_t tag_len = strlen(tag);
    if (tag_len > 255) return 0;
    uint8_t value_msg[300], summary_msg[310];
    Buf v = {value_msg, 0, sizeof value_msg, 1};
    put_bytes_field(&v, 1, tag, tag_len);
    put_float_field(&v, 2, value);
    Buf s = {summary_msg, 0, sizeof summary_msg, 1};
    put_bytes_field(&s, 1, value_msg, v.len);
    if (!v.ok || !s.ok) return 0;

    Buf b = {out, 0, cap, 1};
    put_double_field(&b, 1, wall_time);
    put_varint(&b, 2 << 3 | 0);
    put_varint(&b, (uint64_t)step);
    put_bytes_field(&b, 5, summary_msg, s.len);
    return b.ok ? b.len : 0;
}

size_t tb_frame_record(uint8_t *out, size_t cap, const uint8_t *data, size_t len) {
    if (cap < 16 || len > cap - 16) return 0;
    Buf b = {out, 0, cap, 1};
    put_le(&b, (uint64_t)len, 8);
    put_le(&b, tb_masked_crc32c(out, 8), 4);
    put_bytes(&b, data, len);
    put_le(&b, tb_masked_crc32c(data, len), 4);
    return b.ok ? b.len : 0;
}
