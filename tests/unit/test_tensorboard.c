/* test_tensorboard.c: the TensorBoard event encoding (src/obs/tb_encode.c)
 * against bytes worked out by hand from the protobuf wire format and the
 * TFRecord framing; masked CRCs from the CRC32C test vector and from
 * tensorboard's own masked_crc32c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "obs/tb_encode.h"

/* crc32c("123456789") = 0xE3069283; rotated right by 15 = 0x2507C60D;
 * plus 0xa282ead8 = 0xC78AB0E5. */
static void test_masked_crc_of_check_vector(void **state) {
    (void)state;
    assert_int_equal(tb_masked_crc32c("123456789", 9), 0xC78AB0E5u);
}

/* wall_time 1.0, step 5, tag "a", value 1.0f:
 *   Value   = 0A 01 'a' | 15 00 00 80 3F                     (8 bytes)
 *   Summary = 0A 08 <Value>                                   (10 bytes)
 *   Event   = 09 <1.0 as LE double> | 10 05 | 2A 0A <Summary> (23 bytes) */
static const uint8_t scalar_event[] = {0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0x10, 0x05, 0x2A, 0x0A,
                                       0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0, 0, 0x80, 0x3F};

static void test_scalar_event_bytes(void **state) {
    (void)state;
    uint8_t out[64];
    size_t n = tb_encode_scalar_event(out, sizeof out, 1.0, 5, "a", 1.0f);
    assert_int_equal(n, sizeof scalar_event);
    assert_memory_equal(out, scalar_event, sizeof scalar_event);
}

/* step 300 = 0b1_0010_1100 -> varint AC 02. */
static void test_step_is_a_varint(void **state) {
    (void)state;
    uint8_t out[64];
    size_t n = tb_encode_scalar_event(out, sizeof out, 1.0, 300, "a", 1.0f);
    assert_int_equal(n, sizeof scalar_event + 1);
    assert_int_equal(out[9], 0x10);
    assert_int_equal(out[10], 0xAC);
    assert_int_equal(out[11], 0x02);
}

/* wall_time 0.5 (3FE0...), file_version = 1A 0D "brain.Event:2". */
static void test_file_version_event_bytes(void **state) {
    (void)state;
    uint8_t out[64];
    size_t n = tb_encode_file_version_event(out, sizeof out, 0.5);
    assert_int_equal(n, 9 + 2 + 13);
    const uint8_t head[] = {0x09, 0, 0, 0, 0, 0, 0, 0xE0, 0x3F, 0x1A, 0x0D};
    assert_memory_equal(out, head, sizeof head);
    assert_memory_equal(out + 11, "brain.Event:2", 13);
}

/* wall_time 0.5, step 7 (10 07), session_log = field 7 (3A 02) holding status START (08 01). */
static void test_session_start_event_bytes(void **state) {
    (void)state;
    uint8_t out[64];
    const uint8_t want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xE0, 0x3F, 0x10, 0x07, 0x3A, 0x02, 0x08, 0x01};
    assert_int_equal(tb_encode_session_start_event(out, sizeof out, 0.5, 7), sizeof want);
    assert_memory_equal(out, want, sizeof want);
    assert_int_equal(tb_encode_session_start_event(out, sizeof want - 1, 0.5, 7), 0); /* does not fit */
}

/* Record = LE u64 length | masked crc of those 8 bytes | data | masked crc
 * of the data. 0x1EF8CEE7 is tensorboard's masked_crc32c(pack('<Q', 23)). */
static void test_record_framing(void **state) {
    (void)state;
    uint8_t out[64];
    size_t n = tb_frame_record(out, sizeof out, scalar_event, sizeof scalar_event);
    assert_int_equal(n, sizeof scalar_event + 16);
    const uint8_t length[8] = {23, 0, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(out, length, 8);
    const uint8_t length_crc[4] = {0xE7, 0xCE, 0xF8, 0x1E};
    assert_memory_equal(out + 8, length_crc, 4);
    assert_memory_equal(out + 12, scalar_event, sizeof scalar_event);
    uint32_t data_crc = tb_masked_crc32c(scalar_event, sizeof scalar_event);
    const uint8_t data_crc_le[4] = {(uint8_t)data_crc, (uint8_t)(data_crc >> 8), (uint8_t)(data_crc >> 16),
                                    (uint8_t)(data_crc >> 24)};
    assert_memory_equal(out + 12 + sizeof scalar_event, data_crc_le, 4);
}

static void test_too_small_buffers_fail(void **state) {
    (void)state;
    uint8_t out[64];
    assert_int_equal(tb_encode_scalar_event(out, 22, 1.0, 5, "a", 1.0f), 0);
    assert_int_equal(tb_frame_record(out, 38, scalar_event, sizeof scalar_event), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masked_crc_of_check_vector),
        cmocka_unit_test(test_scalar_event_bytes),
        cmocka_unit_test(test_step_is_a_varint),
        cmocka_unit_test(test_file_version_event_bytes),
        cmocka_unit_test(test_session_start_event_bytes),
        cmocka_unit_test(test_record_framing),
        cmocka_unit_test(test_too_small_buffers_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
