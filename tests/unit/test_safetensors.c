/* test_safetensors.c: safetensors reading and writing (src/convert):
 * fp32 <-> bf16 / f16 conversions (known values, every 16-bit pattern, and
 * the compiler's _Float16 as a second opinion); a byte string assembled by
 * hand (the reference writer's exact output) parsed, and our writer
 * producing the same bytes; write/read round trips for each dtype; sharded
 * models with their index; malformed headers and indexes rejected with
 * messages naming the problem; random corruption never crashes the reader. */
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/fs.h"

#include "core/float16.h"
#include "convert/safetensors.h"
#include "core/rng.h"

#include "test_work_dir.h"

static void test_float16_known_values(void **state) {
    (void)state;
    assert_int_equal(f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(f32_to_bf16(-2.0f), 0xC000);
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);        /* tie: to even (down) */
    assert_int_equal(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);    /* tie: to even (up) */
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81); /* above the tie */
    assert_int_equal(f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(f32_to_bf16(3.4e38f), 0x7F80); /* rounds past the largest bf16 */
    uint16_t nan = f32_to_bf16(NAN);
    assert_true((nan & 0x7F80) == 0x7F80 && (nan & 0x7F) != 0);
    uint32_t low_payload_nan = 0x7F800001u; /* payload only in the bits bf16 drops */
    float f;
    memcpy(&f, &low_payload_nan, 4);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(f))));
    assert_true(bf16_to_f32(0x3F80) == 1.0f);
    assert_true(bf16_to_f32(0xC000) == -2.0f);

    assert_int_equal(f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(f32_to_f16(65520.0f), 0x7C00); /* overflow */
    assert_int_equal(f32_to_f16(0x1p-24f), 0x0001);  /* smallest subnormal */
    assert_int_equal(f32_to_f16(0x1p-25f), 0x0000);  /* tie to even: zero */
    assert_int_equal(f32_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(f32_to_f16(0x1p-14f), 0x0400);  /* smallest normal */
    assert_int_equal(f32_to_f16(0.1f), 0x2E66);
    assert_int_equal(f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(f32_to_f16(-INFINITY), 0xFC00);
    assert_true(f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(f16_to_f32(0x3555) == 0x1.554p-2f);
    assert_true(isnan(f16_to_f32(f32_to_f16(NAN))));
}

/* Every 16-bit pattern survives 16 -> 32 -> 16 (NaNs stay NaN). */
static void test_float16_all_patterns(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float b = bf16_to_f32((uint16_t)h);
        if (isnan(b)) assert_true(isnan(bf16_to_f32(f32_to_bf16(b))));
        else if (f32_to_bf16(b) != h) fail_msg("bf16 %04x -> %08x -> %04x", h, f32_bits(b), f32_to_bf16(b));
        float f = f16_to_f32((uint16_t)h);
        if (isnan(f)) assert_true(isnan(f16_to_f32(f32_to_f16(f))));
        else if (f32_to_f16(f) != h) fail_msg("f16 %04x -> %08x -> %04x", h, f32_bits(f), f32_to_f16(f));
#ifdef __FLT16_MAX__
        _Float16 ref;
        uint16_t hh = (uint16_t)h;
        memcpy(&ref, &hh, 2);
        if (!isnan(f) && (float)ref != f) fail_msg("f16 %04x: %g, the compiler says %g", h, f, (double)(float)ref);
#endif
    }
#ifdef __FLT16_MAX__
    /* Rounding of arbitrary floats agrees with the compiler's conversion. */
    Rng rng;
    rng_seed(&rng, 3);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_next_u64(&rng);
        if (i % 2) u = (u & 0x80FFFFFFu) | ((uint32_t)(100 + rng_below(&rng, 50)) << 23); /* near f16's range */
        float x;
        memcpy(&x, &u, 4);
        if (isnan(x)) continue;
        _Float16 ref = (_Float16)x;
        uint16_t want;
        memcpy(&want, &ref, 2);
        if (f32_to_f16(x) != want) fail_msg("f16 of %a (%08x): %04x, the compiler says %04x", x, u, f32_to_f16(x), want);
    }
#endif
}

/* The reference writer's exact output for {"a": f32 [1, -2], "b": bf16 [1, 0.5]}
 * (safetensors 0.8 save(..., metadata={"format": "pt"})), assembled by hand. */
static const char reference_header[] =
    "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}    ";
static const unsigned char reference_data[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0,
                                               0x80, 0x3F, 0x00, 0x3F};

static size_t reference_bytes(unsigned char *out) {
    size_t header = sizeof reference_header - 1;
    assert_int_equal(header % 8, 0);
    memset(out, 0, 8);
    out[0] = (unsigned char)header; /* 144 < 256 */
    memcpy(out + 8, reference_header, header);
    memcpy(out + 8 + header, reference_data, sizeof reference_data);
    return 8 + header + sizeof reference_data;
}

static unsigned char *read_file(const char *path, size_t *len) { /* the whole file, or the test fails */
    char err[512];
    char *data = mt_read_file(path, (size_t)1 << 30, len, err, sizeof err);
    if (!data) fail_msg("%s", err);
    return (unsigned char *)data;
}

static void test_hand_assembled(void **state) {
    (void)state;
    unsigned char bytes[256];
    size_t len = reference_bytes(bytes);
    char err[512];
    StFile *file = st_parse(bytes, len, "ref", err, sizeof err);
    if (!file) fail_msg("%s", err);
    assert_int_equal(file->num_tensors, 2);
    assert_string_equal(st_metadata_get(file, "format"), "pt");
    const StTensor *a = st_find(file, "a"), *b = st_find(file, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->dtype, ST_F32);
    assert_int_equal(b->dtype, ST_BF16);
    assert_int_equal(a->ndim, 1);
    assert_int_equal(a->shape[0], 2);
    float out[2];
    st_tensor_to_f32(a, out);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    st_tensor_to_f32(b, out);
    assert_true(out[0] == 1.0f && out[1] == 0.5f);
    st_close(file);

    /* Our writer, given the tensors in the other order, writes the same bytes. */
    const float bv[2] = {1.0f, 0.5f}, av[2] = {1.0f, -2.0f};
    StWriteTensor tensors[2] = {{"b", ST_BF16, 1, {2}, bv, false, NULL, NULL}, {"a", ST_F32, 1, {2}, av, false, NULL, NULL}};
    StMetadataEntry meta = {"format", "pt"};
    char path[512];
    snprintf(path, sizeof path, "%s/ref.safetensors", work_dir);
    assert_int_equal(st_write_file(path, tensors, 2, &meta, 1, err, sizeof err), 0);
    size_t written_len;
    unsigned char *written = read_file(path, &written_len);
    assert_int_equal(written_len, len);
    assert_memory_equal(written, bytes, len);
    free(written);
}

static void fill(float *x, size_t n, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(&rng);
    if (n >= 8) {
        x[0] = 0.0f, x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY, x[4] = 1e-40f, x[5] = 65504.0f;
        x[6] = 3.0e38f, x[7] = 1e-8f;
    }
}

/* StFillFn reading from the float array in ctx; a NULL ctx fails at the element asked for. */
static int fill_from(const void *ctx, int64_t first, int64_t count, float *out, char *err, size_t errlen) {
    if (!ctx) {
        snprintf(err, errlen, "no data at element %lld", (long long)first);
        return -1;
    }
    memcpy(out, (const float *)ctx + first, (size_t)count * sizeof(float));
    return 0;
}

/* A tensor made in blocks by a fill (convert's streaming) is written with
 * the same bytes as the same data in memory, for each dtype, also past the
 * writer's 2^20-element block; a failing fill fails the write with its
 * message and leaves no file. */
static void test_filled_tensors(void **state) {
    (void)state;
    const size_t n = ((size_t)1 << 20) + 5;
    float *x = malloc(n * sizeof *x);
    fill(x, n, 7);
    char err[512];
    for (int d = 0; d < 3; d++) {
        StWriteTensor in_memory[2] = {{"big", (StDtype)d, 2, {(int64_t)n / 5, 5}, x, false, NULL, NULL},
                                      {"small", (StDtype)d, 1, {3}, x + 11, false, NULL, NULL}};
        StWriteTensor filled[2] = {in_memory[0], in_memory[1]};
        filled[0].data = NULL, filled[0].fill = fill_from, filled[0].fill_ctx = x;
        filled[1].data = NULL, filled[1].fill = fill_from, filled[1].fill_ctx = x + 11;
        char path[2][512];
        size_t len[2];
        unsigned char *bytes[2];
        for (int k = 0; k < 2; k++) {
            snprintf(path[k], sizeof path[k], "%s/filled%d_%d.safetensors", work_dir, d, k);
            if (st_write_file(path[k], k ? filled : in_memory, 2, NULL, 0, err, sizeof err) != 0) fail_msg("%s", err);
            bytes[k] = read_file(path[k], &len[k]);
        }
        assert_int_equal(len[0], len[1]);
        assert_true(len[0] > n * st_dtype_size((StDtype)d));
        assert_memory_equal(bytes[0], bytes[1], len[0]);
        free(bytes[0]);
        free(bytes[1]);
        filled[0].fill_ctx = NULL;
        snprintf(path[0], sizeof path[0], "%s/filled_fails.safetensors", work_dir);
        assert_int_equal(st_write_file(path[0], filled, 2, NULL, 0, err, sizeof err), -1);
        assert_string_equal(err, "no data at element 0");
        assert_int_not_equal(access(path[0], F_OK), 0);
    }
    free(x);
}

static void test_round_trip_each_dtype(void **state) {
    (void)state;
    enum { M = 7, N = 5, V = 11 };
    float w[M * N], v[V], s[1];
    fill(w, M * N, 1);
    fill(v, V, 2);
    s[0] = 42.5f;
    for (int d = 0; d < 3; d++) {
        StWriteTensor tensors[3] = {{"model.w", (StDtype)d, 2, {M, N}, w, false, NULL, NULL},
                                    {"v", (StDtype)d, 1, {V}, v, false, NULL, NULL},
                                    {"scalar", (StDtype)d, 0, {0}, s, false, NULL, NULL}};
        char path[512], err[512];
        snprintf(path, sizeof path, "%s/rt_%s.safetensors", work_dir, st_dtype_name((StDtype)d));
        assert_int_equal(st_write_file(path, tensors, 3, NULL, 0, err, sizeof err), 0);
        StFile *file = st_open(path, err, sizeof err);
        if (!file) fail_msg("%s", err);
        assert_int_equal(file->num_metadata, 0);
        for (int t = 0; t < 3; t++) {
            const StTensor *got = st_find(file, tensors[t].name);
            assert_non_null(got);
            assert_int_equal(got->dtype, d);
            assert_int_equal(got->ndim, tensors[t].ndim);
            for (int k = 0; k < got->ndim; k++) assert_int_equal(got->shape[k], tensors[t].shape[k]);
            float out[M * N];
            st_tensor_to_f32(got, out);
            for (int64_t i = 0; i < got->numel; i++) {
                float x = tensors[t].data[i];
                float want = d == ST_F32 ? x : d == ST_BF16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x));
                if (f32_bits(out[i]) != f32_bits(want))
                    fail_msg("%s %s[%ld]: %a, want %a", st_dtype_name((StDtype)d), tensors[t].name, (long)i, out[i], want);
                /* and the stored bytes are the little-endian encoding */
                if (d == ST_F32) assert_memory_equal(got->data + 4 * i, &x, 4);
            }
        }
        st_close(file);
    }
}

static void test_sizes(void **state) {
    (void)state;
    uint64_t v;
    assert_int_equal(st_parse_size("5GB", &v), 0);
    assert_true(v == 5000000000ull);
    assert_int_equal(st_parse_size("500MB", &v), 0);
    assert_true(v == 500000000ull);
    assert_int_equal(st_parse_size("2GiB", &v), 0);
    assert_true(v == 2147483648ull);
    assert_int_equal(st_parse_size("1.5kb", &v), 0);
    assert_true(v == 1500);
    assert_int_equal(st_parse_size("1024", &v), 0);
    assert_true(v == 1024);
    assert_int_equal(st_parse_size("0", &v), -1);
    assert_int_equal(st_parse_size("-1GB", &v), -1);
    assert_int_equal(st_parse_size("5XB", &v), -1);
    assert_int_equal(st_parse_size("GB", &v), -1);
    assert_int_equal(st_parse_size("", &v), -1);
}

/* Write the reference file with its header text replaced by `header`
 * (padded to 8 bytes) and `data_len` bytes of data; parse; expect failure
 * with `message` in the error. */
static void expect_header_error(const char *header, size_t data_len, const char *message) {
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) / 8 * 8;
    size_t len = 8 + padded + data_len;
    unsigned char *bytes = calloc(1, len);
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(bytes + 8, header, hlen);
    memset(bytes + 8 + hlen, ' ', padded - hlen);
    char err[512] = "";
    StFile *file = st_parse(bytes, len, "bad.safetensors", err, sizeof err);
    if (file) fail_msg("accepted: %s", header);
    if (!strstr(err, message)) fail_msg("for %s: message '%s' lacks '%s'", header, err, message);
    if (!strstr(err, "bad.safetensors")) fail_msg("message '%s' does not name the file", err);
    free(bytes);
}

#define T(name, dtype, shape, b, e) "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_malformed_headers(void **state) {
    (void)state;
    char err[512];
    unsigned char bytes[256];
    size_t len = reference_bytes(bytes);
    /* too short, header length past the end or over the limit, not JSON */
    assert_null(st_parse(bytes, 5, "short", err, sizeof err));
    assert_non_null(strstr(err, "too short"));
    unsigned char copy[256];
    memcpy(copy, bytes, len);
    copy[0] = 200;
    assert_null(st_parse(copy, len, "long", err, sizeof err));
    assert_non_null(strstr(err, "runs past the end"));
    memcpy(copy, bytes, len);
    copy[5] = 1;
    assert_null(st_parse(copy, len, "huge", err, sizeof err));
    assert_non_null(strstr(err, "limit"));
    memcpy(copy, bytes, len);
    copy[8] = '[';
    assert_null(st_parse(copy, len, "notjson", err, sizeof err));
    assert_non_null(strstr(err, "does not start with '{'"));

    expect_header_error("{\"a\":", 0, "header: line 1, column 9: expected a JSON value");
    expect_header_error("{" T("a", "F32", "[2]", 0, 12) "}", 8, "tensor 'a': data_offsets [0, 12] are out of range");
    expect_header_error("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12,
                        "tensor 'b' (bytes 4..12) overlaps tensor 'a'");
    expect_header_error("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 12, 20) "}", 20,
                        "4 bytes before tensor 'b' belong to no tensor");
    expect_header_error("{" T("a", "F32", "[2]", 0, 8) "}", 12, "the last 4 bytes of the data section belong to no tensor");
    expect_header_error("{" T("a", "F32", "[3]", 0, 8) "}", 8, "tensor 'a': data_offsets [0, 8] hold 8 bytes, but 3 elements of F32 need 12");
    expect_header_error("{" T("a", "BF16", "[2,2]", 0, 16) "}", 16, "4 elements of BF16 need 8");
    expect_header_error("{" T("a", "F32", "[2]", 8, 0) "}", 8, "end before they begin");
    expect_header_error("{" T("a", "F64", "[1]", 0, 8) "}", 8, "tensor 'a' has dtype F64; supported dtypes are F32, BF16 and F16");
    expect_header_error("{" T("a", "Q4", "[1]", 0, 8) "}", 8, "dtype Q4");
    expect_header_error("{" T("a", "F32", "[-2]", 0, 8) "}", 8, "tensor 'a': shape[0] is not a non-negative integer");
    expect_header_error("{" T("a", "F32", "[2.5]", 0, 8) "}", 8, "shape[0]");
    expect_header_error("{" T("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, "at most 8 sizes");
    expect_header_error("{" T("a", "F32", "[4611686018427387904,8]", 0, 8) "}", 8, "shape is too large");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a': expected \"data_offsets\"");
    expect_header_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "data_offsets");
    expect_header_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': missing \"dtype\"");
    expect_header_error("{\"a\":[1]}", 4, "tensor 'a': expected an object, found an array");
    expect_header_error("{" T("a", "F32", "[1]", 0, 4) "," T("a", "F32", "[1]", 4, 8) "}", 8, "tensor 'a' appears twice");
    expect_header_error("{\"__metadata__\":[\"x\"]," T("a", "F32", "[1]", 0, 4) "}", 4, "__metadata__ must be an object");
    expect_header_error("{\"__metadata__\":{\"format\":1}," T("a", "F32", "[1]", 0, 4) "}", 4, "__metadata__.format must be a string");
    /* an empty file of tensors is valid; so is a zero-size tensor */
    unsigned char empty[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    StFile *file = st_parse(empty, sizeof empty, "empty", err, sizeof err);
    assert_non_null(file);
    assert_int_equal(file->num_tensors, 0);
    st_close(file);
    /* missing files are named */
    char path[512];
    snprintf(path, sizeof path, "%s/nope.safetensors", work_dir);
    assert_null(st_open(path, err, sizeof err));
    assert_non_null(strstr(err, "nope.safetensors: cannot open"));
}

/* Random corruption of a valid file: never a crash, and whatever is accepted
 * stays inside the buffer. */
static void test_random_corruption(void **state) {
    (void)state;
    unsigned char bytes[256], copy[256];
    size_t len = reference_bytes(bytes);
    Rng rng;
    rng_seed(&rng, 5);
    int accepted = 0;
    for (int trial = 0; trial < 20000; trial++) {
        memcpy(copy, bytes, len);
        size_t n = len;
        if (trial % 4 == 0) n = (size_t)rng_below(&rng, len + 1); /* truncated */
        int edits = (int)rng_below(&rng, 4);
        for (int e = 0; e < edits && n > 0; e++) copy[rng_below(&rng, n)] = (unsigned char)rng_next_u64(&rng);
        char err[512];
        StFile *file = st_parse(copy, n, "fuzz", err, sizeof err);
        if (!file) continue;
        accepted++;
        for (int t = 0; t < file->num_tensors; t++) {
            const StTensor *x = &file->tensors[t];
            assert_true(x->data >= copy + 8 && x->data + x->nbytes <= copy + n);
        }
        st_close(file);
    }
    assert_true(accepted > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float16_known_values),
        cmocka_unit_test(test_float16_all_patterns),
        cmocka_unit_test(test_hand_assembled),
        cmocka_unit_test(test_round_trip_each_dtype),
        cmocka_unit_test(test_filled_tensors),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_random_corruption),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
