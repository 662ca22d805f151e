/* tb_encode.h: TensorBoard event encoding in memory: the TFRecord framing
 * (length, masked CRC32C of the length, data, masked CRC32C of the data) and
 * the Event / Summary protobuf messages for scalars, hand-encoded.
 *
 * Event:   wall_time = 1 (double), step = 2 (int64), file_version = 3
 *          (string), summary = 5 (Summary), session_log = 7 (SessionLog)
 * SessionLog: status = 1 (enum: START = 1)
 * Summary: value = 1 (repeated Value); Value: tag = 1 (string),
 *          simple_value = 2 (float) */
#ifndef MT_OBS_TB_ENCODE_H
#define MT_OBS_TB_ENCODE_H

#include <stddef.h>
#include <stdint.h>

/* The CRC TFRecord stores: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t tb_masked_crc32c(const void *data, size_t len);

/* An Event with wall_time and file_version "brain.Event:2" into out
 * (capacity cap). Returns its length, or 0 when it does not fit. */
size_t tb_encode_file_version_event(uint8_t *out, size_t cap, double wall_time);

/* An Event with wall_time, step and a SessionLog of status START: TensorBoard
 * then drops the events of earlier files with that step or a later one (a run
 * resumed from a checkpoint trains those steps again). Returns its length, or
 * 0 when it does not fit. */
size_t tb_encode_session_start_event(uint8_t *out, size_t cap, double wall_time, int64_t step);

/* An Event with wall_time, step and one scalar summary value. Returns its
 * length, or 0 when it does not fit (tags are limited to 255 bytes). */
size_t tb_encode_scalar_event(uint8_t *out, size_t cap, double wall_time, int64_t step, const char *tag,
                              float value);

/* data framed as one TFRecord into out. Returns the record length
 * (len + 16), or 0 when it does not fit. */
size_t tb_frame_record(uint8_t *out, size_t cap, const uint8_t *data, size_t len);

#endif
