/* test_ckpt_format.c: the checkpoint format's building blocks: CRC-32C
 * (published check values, incremental use, the SSE4.2 and table versions
 * agreeing), the shuffle4 filter, metadata encode/decode round trip, and
 * decoding bad metadata (every truncation, every flipped byte, mutations
 * with a recomputed checksum, and hand-made semantic errors) always failing
 * cleanly and never crashing; the BASE record (a referenced frozen base), the
 * DATA record (the run's datasets) and their malformed forms; also the iter_ names and the retention plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ckpt/ckpt_codec.h"
#include "ckpt/ckpt_format.h"
#include "ckpt/ckpt_run.h"
#include "core/crc32c.h"
#include "core/rng.h"

static void test_crc32c_known_values(void **state) {
    (void)state;
    assert_int_equal(crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    unsigned char zeros[32] = {0}, ones[32];
    memset(ones, 0xff, sizeof ones);
    assert_int_equal(crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
    assert_int_equal(crc32c(0, ones, 32), 0x62A8AB43u);
    assert_int_equal(crc32c(0, "", 0), 0u);
}

static void test_crc32c_incremental_and_portable(void **state) {
    (void)state;
    unsigned char buf[1000];
    Rng rng;
    rng_seed(&rng, 7);
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rng_next_u64(&rng);
    for (size_t start = 0; start < 9; start++)
        for (size_t len = 0; len + start <= sizeof buf; len += 37) {
            uint32_t whole = crc32c(0, buf + start, len);
            assert_int_equal(whole, crc32c_portable(0, buf + start, len));
            size_t cut = len / 3;
            assert_int_equal(whole, crc32c(crc32c(0, buf + start, cut), buf + start + cut, len - cut));
        }
    uint32_t before = crc32c(0, buf, sizeof buf);
    buf[500] ^= 1;
    assert_int_not_equal(crc32c(0, buf, sizeof buf), before);
}

static void test_shuffle4_round_trip(void **state) {
    (void)state;
    unsigned char in[64], mid[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (unsigned char)(i * 7 + 3);
    ckpt_shuffle4(in, mid, sizeof in);
    assert_int_equal(mid[0], in[0]);
    assert_int_equal(mid[1], in[4]);   /* first bytes of every word come first */
    assert_int_equal(mid[16], in[1]);  /* then the second bytes */
    ckpt_unshuffle4(mid, out, sizeof in);
    assert_memory_equal(in, out, sizeof in);
}

/* A metadata with two shards' worth of chunks: "w" [6, 4] in 3 chunks (one
 * of them a 2-D box), "b" [5] in 1, plus the state record. */
static CkptChunk w_chunks[3], b_chunks[1];
static CkptTensorMeta tensors[2];
static CkptFileMeta files[3];
static CkptDataset datasets[2] = {
    {"train", "/data/web/en", 553, 11094, 70064, 0xd68138e1},
    {"valid", "/data/valid", 0, 34, 0, 0x12345678},
};

static CkptMeta sample_meta(void) {
    files[0] = (CkptFileMeta){"shard_00000.zst", CKPT_FILE_SHARD, 1000, 0x1234};
    files[1] = (CkptFileMeta){"shard_00001.zst", CKPT_FILE_SHARD, 500, 0x5678};
    files[2] = (CkptFileMeta){"model.yaml", CKPT_FILE_MODEL_CONFIG, 300, 0x9abc};
    w_chunks[0] = (CkptChunk){0, 0, 100, 4 * 4 * 4, 0xdead, CKPT_FILTER_SHUFFLE4, {0, 0}, {4, 4}};
    w_chunks[1] = (CkptChunk){1, 0, 50, 2 * 2 * 4, 0xbeef, CKPT_FILTER_NONE, {4, 0}, {2, 2}};
    w_chunks[2] = (CkptChunk){1, 50, 60, 2 * 2 * 4, 0xf00d, CKPT_FILTER_SHUFFLE4, {4, 2}, {2, 2}};
    b_chunks[0] = (CkptChunk){0, 100, 20, 5 * 4, 0xcafe, CKPT_FILTER_NONE, {0}, {5}};
    tensors[0] = (CkptTensorMeta){"w", CKPT_DTYPE_FP32, 2, {6, 4}, 3, w_chunks};
    tensors[1] = (CkptTensorMeta){"b", CKPT_DTYPE_FP32, 1, {5}, 1, b_chunks};
    CkptMeta m = {
        .version = CKPT_FORMAT_VERSION,
        .writer = "megatrain test",
        .iteration = 40,
        .created_unix = 1700000000,
        .num_ranks = 2,
        .has_state = true,
        .state = {40, 320, 20480, {1, 2, 3, 0xffffffffffffffffULL}, 40, 100, 16, 2.5e-4},
        .base = {.present = true, .dir = "/ckpt/base/iter_0000002", .metadata_crc32c = 0x9b1e629a},
        .num_datasets = 2,
        .datasets = datasets,
        .num_files = 3,
        .files = files,
        .num_tensors = 2,
        .tensors = tensors,
    };
    return m;
}

static void encode_sample(unsigned char **data, size_t *len) {
    CkptMeta m = sample_meta();
    char err[256];
    assert_int_equal(ckpt_meta_encode(&m, data, len, err, sizeof err), 0);
}

static void test_meta_round_trip(void **state) {
    (void)state;
    unsigned char *data;
    size_t len;
    encode_sample(&data, &len);
    CkptMeta m;
    char err[512];
    assert_int_equal(ckpt_meta_decode(data, len, &m, err, sizeof err), 0);
    CkptMeta want = sample_meta();
    assert_int_equal(m.iteration, 40);
    assert_int_equal(m.created_unix, 1700000000);
    assert_int_equal(m.num_ranks, 2);
    assert_string_equal(m.writer, "megatrain test");
    assert_true(m.has_state);
    assert_memory_equal(&m.state, &want.state, sizeof m.state);
    assert_true(m.base.present);
    assert_string_equal(m.base.dir, "/ckpt/base/iter_0000002");
    assert_int_equal(m.base.metadata_crc32c, 0x9b1e629a);
    assert_int_equal(m.num_datasets, 2);
    assert_memory_equal(m.datasets, datasets, sizeof datasets); /* split and path NUL-padded alike (both zeroed) */
    assert_int_equal(m.num_files, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(m.files[i].name, files[i].name);
        assert_int_equal(m.files[i].role, files[i].role);
        assert_int_equal(m.files[i].size, files[i].size);
        assert_int_equal(m.files[i].crc32c, files[i].crc32c);
    }
    assert_int_equal(m.num_tensors, 2);
    assert_string_equal(m.tensors[0].name, "w"); /* written order is kept */
    const CkptTensorMeta *w = ckpt_meta_find(&m, "w"), *b = ckpt_meta_find(&m, "b");
    assert_non_null(w);
    assert_non_null(b);
    assert_null(ckpt_meta_find(&m, "c"));
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 6);
    assert_int_equal(w->num_chunks, 3);
    for (int c = 0; c < 3; c++) {
        assert_int_equal(w->chunks[c].file, w_chunks[c].file);
        assert_int_equal(w->chunks[c].offset, w_chunks[c].offset);
        assert_int_equal(w->chunks[c].stored_bytes, w_chunks[c].stored_bytes);
        assert_int_equal(w->chunks[c].crc32c, w_chunks[c].crc32c);
        assert_int_equal(w->chunks[c].filter, w_chunks[c].filter);
        assert_memory_equal(w->chunks[c].start, w_chunks[c].start, 2 * sizeof(int64_t));
        assert_memory_equal(w->chunks[c].shape, w_chunks[c].shape, 2 * sizeof(int64_t));
    }
    assert_int_equal(b->chunks[0].offset, 100);
    ckpt_meta_free(&m);
    free(data);
}

static void test_meta_truncations_and_flips_fail(void **state) {
    (void)state;
    unsigned char *data;
    size_t len;
    encode_sample(&data, &len);
    CkptMeta m;
    char err[512];
    for (size_t cut = 0; cut < len; cut++) {
        err[0] = '\0';
        assert_int_equal(ckpt_meta_decode(data, cut, &m, err, sizeof err), -1);
        assert_true(strlen(err) > 0);
    }
    unsigned char *copy = malloc(len);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(copy, data, len);
            copy[i] ^= (unsigned char)(1u << bit);
            assert_int_equal(ckpt_meta_decode(copy, len, &m, err, sizeof err), -1);
        }
    }
    free(copy);
    free(data);
}

/* Fix the header after editing the body, so only the content is judged. */
static void reseal(unsigned char *data, size_t len) {
    uint32_t crc = crc32c(0, data + CKPT_HEADER_BYTES, len - CKPT_HEADER_BYTES);
    for (int i = 0; i < 4; i++) data[12 + i] = (unsigned char)(crc >> (8 * i));
    uint64_t body = len - CKPT_HEADER_BYTES;
    for (int i = 0; i < 8; i++) data[16 + i] = (unsigned char)(body >> (8 * i));
}

static void test_meta_random_mutations_never_crash(void **state) {
    (void)state;
    unsigned char *data;
    size_t len;
    encode_sample(&data, &len);
    unsigned char *copy = malloc(len + 64);
    Rng rng;
    rng_seed(&rng, 99);
    CkptMeta m;
    char err[512];
    int accepted = 0;
    for (int trial = 0; trial < 20000; trial++) {
        memcpy(copy, data, len);
        size_t n = len;
        int edits = 1 + (int)rng_below(&rng, 4);
        for (int e = 0; e < edits; e++) {
            size_t at = CKPT_HEADER_BYTES + rng_below(&rng, n - CKPT_HEADER_BYTES);
            switch (rng_below(&rng, 3)) {
            case 0: copy[at] = (unsigned char)rng_next_u64(&rng); break;       /* any byte */
            case 1: copy[at] = rng_below(&rng, 2) ? 0xff : 0x00; break;        /* extreme lengths */
            default: n = at > CKPT_HEADER_BYTES ? at : n; break;               /* cut short */
            }
        }
        reseal(copy, n);
        if (ckpt_meta_decode(copy, n, &m, err, sizeof err) == 0) {
            accepted++; /* e.g. a CRC or offset field changed to another valid value */
            assert_true(m.num_tensors <= 2);
            ckpt_meta_free(&m);
        } else {
            assert_true(strlen(err) > 0);
        }
    }
    assert_true(accepted < 20000);
    free(copy);
    free(data);
}

/* Decode sample_meta() after `edit` changed it; expect failure naming `needle`. */
static void expect_rejected(void (*edit)(CkptMeta *), const char *needle) {
    CkptMeta m = sample_meta();
    edit(&m);
    unsigned char *data;
    size_t len;
    char err[512];
    assert_int_equal(ckpt_meta_encode(&m, &data, &len, err, sizeof err), 0);
    CkptMeta out;
    assert_int_equal(ckpt_meta_decode(data, len, &out, err, sizeof err), -1);
    if (!strstr(err, needle)) fail_msg("error '%s' does not mention '%s'", err, needle);
    free(data);
}
static void edit_outside(CkptMeta *m) { m->tensors[0].chunks[1].start[0] = 5; }
static void edit_overlap(CkptMeta *m) { m->tensors[0].chunks[2].start[1] = 1; }
static void edit_gap(CkptMeta *m) { m->tensors[0].num_chunks = 2; }
static void edit_file_index(CkptMeta *m) { m->tensors[1].chunks[0].file = 2; /* model.yaml */ }
static void edit_beyond_file(CkptMeta *m) { m->tensors[1].chunks[0].offset = 990; }
static void edit_raw_bytes(CkptMeta *m) { m->tensors[1].chunks[0].raw_bytes = 24; }
static void edit_duplicate_name(CkptMeta *m) { m->tensors[1].name = "w"; }
static void edit_file_name(CkptMeta *m) { m->files[1].name = "../escape"; }

static void edit_tokens_overflow(CkptMeta *m) { m->state.consumed_tokens = INT64_MAX; }
static void edit_optimizer_ahead(CkptMeta *m) { m->state.optimizer_step = m->state.step + 1; }
static void edit_samples_over_tokens(CkptMeta *m) { m->state.consumed_samples = m->state.consumed_tokens + 1; }

static void test_meta_semantic_errors(void **state) {
    (void)state;
    /* progress counters a run cannot write (the next step's arithmetic would overflow on the first) */
    expect_rejected(edit_tokens_overflow, "progress counters beyond 2^53");
    expect_rejected(edit_optimizer_ahead, "inconsistent progress counters (step 40, optimizer step 41");
    expect_rejected(edit_samples_over_tokens, "inconsistent progress counters");
    expect_rejected(edit_outside, "outside the tensor");
    expect_rejected(edit_overlap, "overlap");
    expect_rejected(edit_gap, "hold 20 of 24 elements");
    expect_rejected(edit_file_index, "not a shard file");
    expect_rejected(edit_beyond_file, "outside shard_00000.zst");
    expect_rejected(edit_raw_bytes, "raw_bytes");
    expect_rejected(edit_duplicate_name, "listed twice");
    expect_rejected(edit_file_name, "bad file name");
    CkptMeta m = sample_meta();
    m.tensors[1].ndim = 5; /* the encoder refuses what the decoder would */
    unsigned char *data = NULL;
    size_t len;
    char err[256];
    assert_int_equal(ckpt_meta_encode(&m, &data, &len, err, sizeof err), -1);
    assert_non_null(strstr(err, "dimensions"));
}

static void test_meta_unknown_record_is_skipped_and_newer_version_refused(void **state) {
    (void)state;
    unsigned char *data;
    size_t len;
    encode_sample(&data, &len);
    /* Append a record "XTRA" of 3 bytes: a later version's addition. */
    unsigned char *longer = malloc(len + 15);
    memcpy(longer, data, len);
    memcpy(longer + len, "XTRA\x03\0\0\0\0\0\0\0abc", 15);
    reseal(longer, len + 15);
    CkptMeta m;
    char err[512];
    assert_int_equal(ckpt_meta_decode(longer, len + 15, &m, err, sizeof err), 0);
    assert_int_equal(m.num_tensors, 2);
    ckpt_meta_free(&m);
    data[8] = 2; /* format version 2 */
    assert_int_equal(ckpt_meta_decode(data, len, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "format version 2"));
    free(longer);
    free(data);
}

/* Every record given twice (a copy appended, resealed) is refused by name,
 * before the copy is decoded over the first (under the fuzz harness's
 * LeakSanitizer that leaked the first INFO's writer string). */
static void test_meta_repeated_record_refused(void **state) {
    (void)state;
    unsigned char *data;
    size_t len;
    encode_sample(&data, &len);
    int records = 0;
    for (size_t at = CKPT_HEADER_BYTES; at + 12 <= len;) {
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)data[at + 4 + i] << (8 * i);
        assert_true(n <= len - at - 12);
        size_t rec = 12 + (size_t)n;
        unsigned char *twice = malloc(len + rec);
        memcpy(twice, data, len);
        memcpy(twice + len, data + at, rec);
        reseal(twice, len + rec);
        CkptMeta m;
        char err[512], want[64];
        assert_int_equal(ckpt_meta_decode(twice, len + rec, &m, err, sizeof err), -1);
        snprintf(want, sizeof want, "record '%.4s' appears twice", (const char *)data + at);
        if (!strstr(err, want)) fail_msg("error '%s' does not say %s", err, want);
        free(twice);
        records++;
        at += rec;
    }
    assert_int_equal(records, 6); /* INFO, STAT, BASE, DATA, FILE, TENS */
    free(data);
}

/* The sample without its BASE and DATA records, then a `tag` record of `n` payload bytes appended, resealed:
 * decoded into *m. Returns ckpt_meta_decode's result. */
static int decode_with_record(const char *tag, const unsigned char *payload, size_t n, CkptMeta *m, char *err,
                              size_t errlen) {
    CkptMeta sample = sample_meta();
    sample.base.present = false;
    sample.num_datasets = 0;
    unsigned char *data;
    size_t len;
    assert_int_equal(ckpt_meta_encode(&sample, &data, &len, err, errlen), 0);
    unsigned char *longer = malloc(len + 12 + n);
    memcpy(longer, data, len);
    memcpy(longer + len, tag, 4);
    for (int i = 0; i < 8; i++) longer[len + 4 + i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(longer + len + 12, payload, n);
    reseal(longer, len + 12 + n);
    int rc = ckpt_meta_decode(longer, len + 12 + n, m, err, errlen);
    free(longer);
    free(data);
    return rc;
}

/* A BASE payload: u32 length (`claimed`, or strlen(dir) when -1), the dir's bytes, then `tail` (n_tail bytes). */
static size_t base_payload(unsigned char *out, const char *dir, size_t dir_len, long claimed, const void *tail,
                           size_t n_tail) {
    const uint32_t n = claimed < 0 ? (uint32_t)dir_len : (uint32_t)claimed;
    for (int i = 0; i < 4; i++) out[i] = (unsigned char)(n >> (8 * i));
    memcpy(out + 4, dir, dir_len);
    memcpy(out + 4 + dir_len, tail, n_tail);
    return 4 + dir_len + n_tail;
}

static void expect_base_rejected(const unsigned char *payload, size_t n, const char *needle) {
    CkptMeta m;
    char err[512] = "";
    assert_int_equal(decode_with_record("BASE", payload, n, &m, err, sizeof err), -1);
    if (!strstr(err, needle) || !strstr(err, "BASE")) fail_msg("error '%s' does not say BASE ... %s", err, needle);
    assert_false(m.base.present); /* the decoder left nothing behind (meta is empty) */
    assert_null(m.tensors);
}

/* The BASE record: a stored reference reads back; a checkpoint without one has none; each malformed form
 * (empty, relative, too long, a NUL, cut short, bytes after its fields, a length past the record) is refused
 * naming the record, and the encoder refuses what the decoder would. */
static void test_meta_base_record(void **state) {
    (void)state;
    unsigned char payload[CKPT_BASE_DIR_MAX + 64];
    const unsigned char crc[4] = {0x78, 0x56, 0x34, 0x12};
    CkptMeta m;
    char err[512];
    size_t n = base_payload(payload, "/a/b", 4, -1, crc, 4);
    assert_int_equal(decode_with_record("BASE", payload, n, &m, err, sizeof err), 0);
    assert_true(m.base.present);
    assert_string_equal(m.base.dir, "/a/b");
    assert_int_equal(m.base.metadata_crc32c, 0x12345678);
    ckpt_meta_free(&m);
    char longest[CKPT_BASE_DIR_MAX + 2];
    memset(longest, 'x', sizeof longest);
    longest[0] = '/';
    n = base_payload(payload, longest, CKPT_BASE_DIR_MAX, -1, crc, 4); /* the longest allowed */
    assert_int_equal(decode_with_record("BASE", payload, n, &m, err, sizeof err), 0);
    assert_int_equal(strlen(m.base.dir), CKPT_BASE_DIR_MAX);
    ckpt_meta_free(&m);

    CkptMeta plain = sample_meta(); /* without the record: no base */
    plain.base.present = false;
    unsigned char *data;
    size_t len;
    assert_int_equal(ckpt_meta_encode(&plain, &data, &len, err, sizeof err), 0);
    assert_int_equal(ckpt_meta_decode(data, len, &m, err, sizeof err), 0);
    assert_false(m.base.present);
    ckpt_meta_free(&m);
    free(data);

    n = base_payload(payload, "", 0, -1, crc, 4);
    expect_base_rejected(payload, n, "not an absolute path");
    n = base_payload(payload, "runs/base", 9, -1, crc, 4);
    expect_base_rejected(payload, n, "not an absolute path");
    n = base_payload(payload, longest, CKPT_BASE_DIR_MAX + 1, -1, crc, 4);
    expect_base_rejected(payload, n, "1024 bytes long (at most 1023 expected)");
    n = base_payload(payload, "/a\0b", 4, -1, crc, 4);
    expect_base_rejected(payload, n, "NUL");
    n = base_payload(payload, "/a/b", 4, -1, crc, 2);
    expect_base_rejected(payload, n, "truncated (reading base metadata crc32c)");
    n = base_payload(payload, "/a/b", 4, 40, crc, 4); /* the string claims more than the record holds */
    expect_base_rejected(payload, n, "truncated (reading base directory)");
    n = base_payload(payload, "/a/b", 4, 0xffffffffL, crc, 4);
    expect_base_rejected(payload, n, "at most 1023 expected");
    const unsigned char crc_and_more[6] = {0x78, 0x56, 0x34, 0x12, 0, 0};
    n = base_payload(payload, "/a/b", 4, -1, crc_and_more, 6);
    expect_base_rejected(payload, n, "2 bytes after its fields");

    CkptMeta bad = sample_meta();
    snprintf(bad.base.dir, sizeof bad.base.dir, "relative/dir");
    data = NULL;
    assert_int_equal(ckpt_meta_encode(&bad, &data, &len, err, sizeof err), -1);
    assert_non_null(strstr(err, "absolute path"));
    bad.base.dir[0] = '\0';
    assert_int_equal(ckpt_meta_encode(&bad, &data, &len, err, sizeof err), -1);
    assert_null(data);
}

/* A DATA payload under construction (little-endian fields as the format has them). */
typedef struct Payload {
    unsigned char b[512];
    size_t n;
} Payload;
static void put_le(Payload *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p->b[p->n++] = (unsigned char)(v >> (8 * i));
}
static void put_string(Payload *p, const char *s, size_t len) {
    put_le(p, len, 4);
    memcpy(p->b + p->n, s, len);
    p->n += len;
}
/* count, then one dataset: split, path (len bytes), documents, idx and bin bytes, crc */
static Payload data_payload(uint32_t count, const char *split, const char *path, size_t path_len, int64_t documents) {
    Payload p = {.n = 0};
    put_le(&p, count, 4);
    put_string(&p, split, strlen(split));
    put_string(&p, path, path_len);
    put_le(&p, (uint64_t)documents, 8);
    put_le(&p, 34 + 20 * 3, 8);
    put_le(&p, 4096, 8);
    put_le(&p, 0xabcdef01, 4);
    return p;
}

/* A malformed DATA record is dropped, not the checkpoint: it decodes, without datasets, marked unreadable; the
 * same bytes under a tag the reader does not know are skipped without the mark. */
static void expect_data_dropped(const Payload *p) {
    CkptMeta m;
    char err[512] = "";
    assert_int_equal(decode_with_record("DATA", p->b, p->n, &m, err, sizeof err), 0);
    assert_int_equal(m.num_datasets, 0);
    assert_null(m.datasets);
    assert_true(m.datasets_unreadable);
    assert_int_equal(m.num_tensors, 2); /* the rest of the metadata is there */
    ckpt_meta_free(&m);
}

/* The DATA record: datasets read back as written; a checkpoint without the record has none; each malformed form
 * (no datasets, more than it holds, another split, an empty path, a NUL, negative documents, cut short, bytes
 * after its datasets) drops the record, marked, and keeps the checkpoint readable (the record feeds only a
 * warning; a checkpoint that failed to decode would be moved aside as corrupt); the encoder refuses more datasets
 * than a reader takes. */
static void test_meta_data_record(void **state) {
    (void)state;
    CkptMeta m;
    char err[512];
    Payload p = data_payload(1, "valid", "/d/en", 5, 3);
    assert_int_equal(decode_with_record("DATA", p.b, p.n, &m, err, sizeof err), 0);
    assert_int_equal(m.num_datasets, 1);
    assert_string_equal(m.datasets[0].split, "valid");
    assert_string_equal(m.datasets[0].path, "/d/en");
    assert_int_equal(m.datasets[0].documents, 3);
    assert_int_equal(m.datasets[0].idx_bytes, 94);
    assert_int_equal(m.datasets[0].bin_bytes, 4096);
    assert_int_equal(m.datasets[0].crc32c, 0xabcdef01);
    assert_false(m.datasets_unreadable);
    ckpt_meta_free(&m);
    assert_int_equal(decode_with_record("XTRA", p.b, p.n, &m, err, sizeof err), 0); /* no DATA: none */
    assert_int_equal(m.num_datasets, 0);
    assert_null(m.datasets);
    assert_false(m.datasets_unreadable);
    ckpt_meta_free(&m);

    p = data_payload(0, "train", "/d/en", 5, 3); /* no datasets */
    expect_data_dropped(&p);
    p = data_payload(2, "train", "/d/en", 5, 3); /* more than it holds */
    expect_data_dropped(&p);
    p = data_payload(1, "tune", "/d/en", 5, 3); /* a split of a later version */
    expect_data_dropped(&p);
    p = data_payload(1, "test", "/d/en", 5, 3); /* data.test's datasets */
    assert_int_equal(decode_with_record("DATA", p.b, p.n, &m, err, sizeof err), 0);
    assert_int_equal(m.num_datasets, 1);
    assert_string_equal(m.datasets[0].split, "test");
    assert_false(m.datasets_unreadable);
    ckpt_meta_free(&m);
    p = data_payload(1, "train", "", 0, 3);
    expect_data_dropped(&p);
    p = data_payload(1, "train", "/d\0en", 5, 3);
    expect_data_dropped(&p);
    p = data_payload(1, "train", "/d/en", 5, -1);
    expect_data_dropped(&p);
    p = data_payload(1, "train", "/d/en", 5, 3);
    p.n -= 2; /* cut short */
    expect_data_dropped(&p);
    p = data_payload(1, "train", "/d/en", 5, 3);
    put_le(&p, 0, 3); /* a field of a later version */
    expect_data_dropped(&p);
    CkptMeta many = sample_meta();
    many.num_datasets = CKPT_MAX_DATASETS + 1;
    unsigned char *data = NULL;
    size_t len;
    assert_int_equal(ckpt_meta_encode(&many, &data, &len, err, sizeof err), -1);
    assert_non_null(strstr(err, "at most 4096"));
    assert_null(data);
}

static void test_iter_names(void **state) {
    (void)state;
    assert_int_equal(ckpt_parse_iter_name("iter_0000040"), 40);
    assert_int_equal(ckpt_parse_iter_name("iter_12345678"), 12345678);
    assert_int_equal(ckpt_parse_iter_name("iter_000040"), -1);       /* 6 digits */
    assert_int_equal(ckpt_parse_iter_name("iter_0000040.tmp.12"), -1);
    assert_int_equal(ckpt_parse_iter_name("iter_0000040.invalid"), -1);
    assert_int_equal(ckpt_parse_iter_name("iter_00000x0"), -1);
    char path[64];
    assert_int_equal(ckpt_iter_path(path, sizeof path, "c", 7), 0);
    assert_string_equal(path, "c/iter_0000007");
}

static void test_retention_plan(void **state) {
    (void)state;
    const long steps[] = {10, 20, 30, 40, 50, 60};
    bool keep[6];
    ckpt_retention_plan(steps, 6, 2, 0, keep);
    const bool last_two[] = {false, false, false, false, true, true};
    assert_memory_equal(keep, last_two, sizeof keep);
    ckpt_retention_plan(steps, 6, 2, 20, keep);
    const bool with_every[] = {false, true, false, true, true, true};
    assert_memory_equal(keep, with_every, sizeof keep);
    ckpt_retention_plan(steps, 6, 1, 0, keep);
    const bool newest[] = {false, false, false, false, false, true};
    assert_memory_equal(keep, newest, sizeof keep);
    ckpt_retention_plan(steps, 6, 0, 0, keep); /* 0: every one (torchtitan's keep_latest_k = 0) */
    for (int i = 0; i < 6; i++) assert_true(keep[i]);
    ckpt_retention_plan(steps, 6, 10, 0, keep);
    for (int i = 0; i < 6; i++) assert_true(keep[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_known_values),
        cmocka_unit_test(test_crc32c_incremental_and_portable),
        cmocka_unit_test(test_shuffle4_round_trip),
        cmocka_unit_test(test_meta_round_trip),
        cmocka_unit_test(test_meta_truncations_and_flips_fail),
        cmocka_unit_test(test_meta_random_mutations_never_crash),
        cmocka_unit_test(test_meta_semantic_errors),
        cmocka_unit_test(test_meta_unknown_record_is_skipped_and_newer_version_refused),
        cmocka_unit_test(test_meta_repeated_record_refused),
        cmocka_unit_test(test_meta_base_record),
        cmocka_unit_test(test_meta_data_record),
        cmocka_unit_test(test_iter_names),
        cmocka_unit_test(test_retention_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
