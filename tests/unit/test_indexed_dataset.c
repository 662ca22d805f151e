/* test_indexed_dataset.c: the MMIDIDX writer and reader.
 *
 * Round trips for uint16 and int32; the writer's .idx compared byte for byte
 * with a layout spelled out here from the format (so a layout mistake shared
 * by writer and reader is still caught); a hand-written dataset read back;
 * every kind of bad file rejected with an error naming it; an existing
 * dataset replaced only when the writer may overwrite; and the fingerprint a
 * checkpoint records (the same for the same contents at another path,
 * another for another token or document, its documented blind spot).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/crc32c.h"
#include "data/indexed_dataset.h"
#include "data/indexed_dataset_writer.h"

static char work_dir[256];
static char path_buf[512];

static int setup(void **state) {
    strcpy(work_dir, "/tmp/mt_test_idx_XXXXXX");
    assert_non_null(mkdtemp(work_dir));
    return 0;
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", work_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *in_work(const char *name) {
    snprintf(path_buf, sizeof(path_buf), "%s/%s", work_dir, name);
    return path_buf;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static long count_dir_entries(void) {
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", work_dir);
    FILE *p = popen(cmd, "r");
    long n = -1;
    if (fscanf(p, "%ld", &n) != 1) n = -1;
    pclose(p);
    return n;
}

/* Little-endian byte builders for the hand-written files. */
typedef struct Bytes {
    uint8_t data[4096];
    size_t len;
} Bytes;

static void put_le(Bytes *b, uint64_t v, int size) {
    for (int i = 0; i < size; i++) b->data[b->len++] = (uint8_t)(v >> (8 * i));
}

static void put_raw(Bytes *b, const void *p, size_t n) {
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* The .idx of documents with these lengths, each one sequence, per the format. */
static Bytes expected_index(int dtype_code, int token_size, const int *lengths, int n) {
    Bytes b = {.len = 0};
    put_raw(&b, "MMIDIDX\0\0", 9);
    put_le(&b, 1, 8);            /* version */
    put_le(&b, dtype_code, 1);   /* dtype code */
    put_le(&b, n, 8);            /* sequences */
    put_le(&b, n + 1, 8);        /* document index entries: documents + 1 */
    for (int i = 0; i < n; i++) put_le(&b, lengths[i], 4);
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        put_le(&b, offset, 8);
        offset += (uint64_t)lengths[i] * token_size;
    }
    for (int i = 0; i <= n; i++) put_le(&b, i, 8);
    return b;
}

static Bytes read_whole(const char *path) {
    Bytes b = {.len = 0};
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    b.len = fread(b.data, 1, sizeof(b.data), f);
    fclose(f);
    return b;
}

static int32_t token_value(int doc, int pos, int dtype_code) {
    int32_t v = doc * 1009 + pos * 7;
    return dtype_code == IDX_DTYPE_UINT16 ? v % 65536 : v * 37 - 40000; /* int32: negatives and > 65535 */
}

static void round_trip(int dtype_code, int token_size) {
    const int lengths[] = {5, 1, 0, 17, 300, 2};
    const int n = 6;
    char err[512] = "";
    const char *prefix = in_work("data");
    char prefix_copy[512];
    strcpy(prefix_copy, prefix);
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix_copy, dtype_code, err, sizeof(err));
    assert_non_null(w);
    int32_t tokens[300];
    for (int d = 0; d < n; d++) {
        for (int p = 0; p < lengths[d]; p++) tokens[p] = token_value(d, p, dtype_code);
        assert_int_equal(indexed_dataset_writer_add_document(w, tokens, lengths[d]), 0);
    }
    /* Nothing visible under the prefix until finish. */
    char bin_path[600], idx_path[600];
    snprintf(bin_path, sizeof(bin_path), "%s.bin", prefix_copy);
    snprintf(idx_path, sizeof(idx_path), "%s.idx", prefix_copy);
    assert_false(file_exists(bin_path));
    assert_false(file_exists(idx_path));
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof(err)), 0);
    assert_int_equal(count_dir_entries(), 2); /* no temporary files left */

    Bytes want = expected_index(dtype_code, token_size, lengths, n);
    Bytes got = read_whole(idx_path);
    assert_int_equal(got.len, want.len);
    assert_memory_equal(got.data, want.data, want.len);
    int total = 0;
    for (int d = 0; d < n; d++) total += lengths[d];
    struct stat st;
    assert_int_equal(stat(bin_path, &st), 0);
    assert_int_equal(st.st_size, total * token_size);

    IndexedDataset ds;
    assert_int_equal(indexed_dataset_open(&ds, prefix_copy, err, sizeof(err)), 0);
    assert_int_equal(ds.dtype_code, dtype_code);
    assert_int_equal(ds.token_size, token_size);
    assert_int_equal(ds.num_sequences, n);
    assert_int_equal(ds.num_documents_plus_one, n + 1);
    for (int d = 0; d < n; d++) {
        assert_int_equal(indexed_length(&ds, d), lengths[d]);
        int32_t out[300];
        indexed_dataset_read(&ds, d, 0, lengths[d], out);
        for (int p = 0; p < lengths[d]; p++) assert_int_equal(out[p], token_value(d, p, dtype_code));
    }
    for (int i = 0; i <= n; i++) assert_int_equal(indexed_document(&ds, i), i);
    /* A read from the middle of a sequence. */
    int32_t part[3];
    indexed_dataset_read(&ds, 4, 100, 3, part);
    for (int p = 0; p < 3; p++) assert_int_equal(part[p], token_value(4, 100 + p, dtype_code));
    indexed_dataset_close(&ds);
}

static void test_round_trip_uint16(void **state) { round_trip(IDX_DTYPE_UINT16, 2); }
static void test_round_trip_int32(void **state) { round_trip(IDX_DTYPE_INT32, 4); }

/* Megatron-style file written by hand: 2 documents made of 3 sequences
 * (the first document has two), uint8 tokens. */
static void test_hand_written_dataset(void **state) {
    Bytes idx = {.len = 0};
    put_raw(&idx, "MMIDIDX\0\0", 9);
    put_le(&idx, 1, 8);
    put_le(&idx, 1, 1); /* uint8 */
    put_le(&idx, 3, 8);
    put_le(&idx, 3, 8);
    put_le(&idx, 2, 4), put_le(&idx, 0, 4), put_le(&idx, 3, 4); /* lengths */
    put_le(&idx, 0, 8), put_le(&idx, 2, 8), put_le(&idx, 2, 8); /* byte offsets */
    put_le(&idx, 0, 8), put_le(&idx, 2, 8), put_le(&idx, 3, 8); /* document boundaries */
    assert_int_equal(idx.len, 34 + 3 * 4 + 3 * 8 + 3 * 8);
    const uint8_t bin[] = {200, 201, 7, 8, 255};
    write_file(in_work("hand.idx"), idx.data, idx.len);
    write_file(in_work("hand.bin"), bin, sizeof(bin));
    IndexedDataset ds;
    char err[512] = "";
    char prefix[512];
    strcpy(prefix, in_work("hand"));
    assert_int_equal(indexed_dataset_open(&ds, prefix, err, sizeof(err)), 0);
    assert_int_equal(ds.num_sequences, 3);
    assert_int_equal(ds.num_documents_plus_one, 3);
    assert_int_equal(indexed_document(&ds, 1), 2);
    assert_int_equal(indexed_offset(&ds, 2), 2);
    int32_t out[3];
    indexed_dataset_read(&ds, 0, 0, 2, out);
    assert_int_equal(out[0], 200);
    assert_int_equal(out[1], 201);
    indexed_dataset_read(&ds, 2, 0, 3, out);
    assert_int_equal(out[0], 7);
    assert_int_equal(out[2], 255);
    indexed_dataset_close(&ds);
}

/* int64 tokens (dtype 5): ids within int32 read as they are; one beyond reads as -1, outside every vocabulary
 * (cut to 32 bits, 2^32 + 97 read as 97 and passed the vocabulary checks). */
static void test_int64_ids(void **state) {
    (void)state;
    Bytes idx = {.len = 0};
    put_raw(&idx, "MMIDIDX\0\0", 9);
    put_le(&idx, 1, 8);
    put_le(&idx, 5, 1); /* int64 */
    put_le(&idx, 1, 8);
    put_le(&idx, 2, 8);
    put_le(&idx, 5, 4);                         /* one sequence of 5 tokens */
    put_le(&idx, 0, 8);                         /* at byte 0 */
    put_le(&idx, 0, 8), put_le(&idx, 1, 8);     /* one document */
    Bytes bin = {.len = 0};
    const int64_t ids[] = {97, INT32_MAX, (INT64_C(1) << 32) + 97, -5, INT64_MIN};
    for (int i = 0; i < 5; i++) put_le(&bin, (uint64_t)ids[i], 8);
    write_file(in_work("wide.idx"), idx.data, idx.len);
    write_file(in_work("wide.bin"), bin.data, bin.len);
    IndexedDataset ds;
    char err[512] = "", prefix[512];
    strcpy(prefix, in_work("wide"));
    assert_int_equal(indexed_dataset_open(&ds, prefix, err, sizeof(err)), 0);
    int32_t out[5];
    indexed_dataset_read(&ds, 0, 0, 5, out);
    assert_int_equal(out[0], 97);
    assert_int_equal(out[1], INT32_MAX);
    assert_int_equal(out[2], -1);
    assert_int_equal(out[3], -5);
    assert_int_equal(out[4], -1);
    indexed_dataset_close(&ds);
}

/* Write a valid uint16 dataset "good" of two documents (3 and 2 tokens). */
static void write_good(const char *name) {
    char err[512], prefix[512];
    strcpy(prefix, in_work(name));
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_UINT16, err, sizeof(err));
    assert_non_null(w);
    int32_t a[] = {1, 2, 3}, b[] = {4, 5};
    assert_int_equal(indexed_dataset_writer_add_document(w, a, 3), 0);
    assert_int_equal(indexed_dataset_writer_add_document(w, b, 2), 0);
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof(err)), 0);
}

/* Open `name` expecting failure whose message contains both needles. */
static void expect_open_error(const char *name, const char *needle1, const char *needle2) {
    IndexedDataset ds;
    char err[1024] = "", prefix[512];
    strcpy(prefix, in_work(name));
    assert_int_equal(indexed_dataset_open(&ds, prefix, err, sizeof(err)), -1);
    if (!strstr(err, needle1) || !strstr(err, needle2)) fail_msg("error '%s' lacks '%s' or '%s'", err, needle1, needle2);
}

static void patch_byte(const char *path, long at, uint8_t value) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, at, SEEK_SET);
    fputc(value, f);
    fclose(f);
}

static void test_errors(void **state) {
    char path[600];
    expect_open_error("missing", "missing.idx", "cannot open");
    /* a file name given for the prefix: the message names the prefix */
    write_good("named");
    expect_open_error("named.idx", "named.idx.idx: cannot open", "(a dataset is named by its prefix, without .bin or "
                      ".idx: ");
    expect_open_error("named.bin", "named.bin.idx: cannot open", "without .bin or .idx: ");

    write_good("magic");
    snprintf(path, sizeof(path), "%s", in_work("magic.idx"));
    patch_byte(path, 0, 'X');
    expect_open_error("magic", "magic.idx", "bad magic");

    write_good("version");
    snprintf(path, sizeof(path), "%s", in_work("version.idx"));
    patch_byte(path, 9, 2);
    expect_open_error("version", "version.idx", "version 2");

    write_good("float");
    snprintf(path, sizeof(path), "%s", in_work("float.idx"));
    patch_byte(path, 17, 7);
    expect_open_error("float", "float.idx", "float32");

    write_good("shortidx");
    snprintf(path, sizeof(path), "%s", in_work("shortidx.idx"));
    assert_int_equal(truncate(path, 40), 0);
    expect_open_error("shortidx", "shortidx.idx", "truncated");
    assert_int_equal(truncate(path, 20), 0);
    expect_open_error("shortidx", "shortidx.idx", "truncated");

    /* counts whose size overflows 64 bits: the exact size, 34 + 12 * 2^63 + 8 * 3 */
    write_good("hugecount");
    snprintf(path, sizeof(path), "%s", in_work("hugecount.idx"));
    patch_byte(path, 18, 0);
    patch_byte(path, 25, 0x80);
    expect_open_error("hugecount", "9223372036854775808 sequences and 3 document entries",
                      "need 110680464442257309754 bytes, file has 82");
    patch_byte(path, 18, 0xff);
    for (int i = 19; i < 34; i++) patch_byte(path, i, 0xff); /* 2^64 - 1 of both: 20 (2^64 - 1) + 34 */
    expect_open_error("hugecount", "18446744073709551615 sequences", "need 368934881474191032334 bytes");

    write_good("shortbin");
    snprintf(path, sizeof(path), "%s", in_work("shortbin.bin"));
    assert_int_equal(truncate(path, 9), 0); /* 5 tokens need 10 bytes */
    expect_open_error("shortbin", "shortbin.bin", "outside");

    write_good("nobin");
    snprintf(path, sizeof(path), "%s", in_work("nobin.bin"));
    assert_int_equal(unlink(path), 0);
    expect_open_error("nobin", "nobin.bin", "cannot open");

    write_good("baddocs");
    snprintf(path, sizeof(path), "%s", in_work("baddocs.idx"));
    patch_byte(path, 34 + 2 * 4 + 2 * 8 + 8, 9); /* second boundary: 9 > 2 sequences */
    expect_open_error("baddocs", "baddocs.idx", "document index");
}

static void test_writer_rejects_and_aborts(void **state) {
    char err[512] = "", prefix[512];
    strcpy(prefix, in_work("big"));
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_UINT16, err, sizeof(err));
    assert_non_null(w);
    int32_t ok[] = {1, 65535}, bad[] = {3, 70000};
    assert_int_equal(indexed_dataset_writer_add_document(w, ok, 2), 0);
    assert_int_equal(indexed_dataset_writer_add_document(w, bad, 2), -1);
    assert_non_null(strstr(indexed_dataset_writer_error(w), "70000"));
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "uint16"));
    assert_int_equal(count_dir_entries(), 0);

    w = indexed_dataset_writer_open(prefix, IDX_DTYPE_INT32, err, sizeof(err));
    assert_non_null(w);
    assert_int_equal(indexed_dataset_writer_add_document(w, bad, 2), 0);
    indexed_dataset_writer_abort(w);
    assert_int_equal(count_dir_entries(), 0);

    assert_null(indexed_dataset_writer_open(prefix, IDX_DTYPE_FLOAT32, err, sizeof(err)));
}

/* Write one document of `n` tokens (all `token`) under prefix; finish's result. */
static int write_one(const char *prefix, int32_t token, int n, bool overwrite, char *err, size_t errlen) {
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_UINT16, err, errlen);
    assert_non_null(w);
    indexed_dataset_writer_set_overwrite(w, overwrite);
    int32_t tokens[8];
    for (int i = 0; i < n; i++) tokens[i] = token;
    assert_int_equal(indexed_dataset_writer_add_document(w, tokens, n), 0);
    return indexed_dataset_writer_finish(w, err, errlen);
}

/* An existing dataset is not replaced (finish fails naming the file, the
 * old files stay, no temporary file is left) unless overwrite is set. */
static void test_writer_overwrite(void **state) {
    char err[512] = "", prefix[512], bin[600], idx[600];
    strcpy(prefix, in_work("ds"));
    snprintf(bin, sizeof(bin), "%s.bin", prefix);
    snprintf(idx, sizeof(idx), "%s.idx", prefix);
    assert_int_equal(write_one(prefix, 7, 3, false, err, sizeof(err)), 0);
    Bytes old_bin = read_whole(bin), old_idx = read_whole(idx);
    assert_int_equal(old_bin.len, 6);

    assert_int_equal(write_one(prefix, 9, 5, false, err, sizeof(err)), -1);
    if (!strstr(err, bin) || !strstr(err, "already exists (not replaced)")) fail_msg("%s", err);
    Bytes b = read_whole(bin), i = read_whole(idx);
    assert_true(b.len == old_bin.len && memcmp(b.data, old_bin.data, b.len) == 0);
    assert_true(i.len == old_idx.len && memcmp(i.data, old_idx.data, i.len) == 0);
    assert_int_equal(count_dir_entries(), 2);

    assert_int_equal(unlink(bin), 0); /* a lone .idx is not replaced either, and no .bin is left beside it */
    assert_int_equal(write_one(prefix, 9, 5, false, err, sizeof(err)), -1);
    if (!strstr(err, idx) || !strstr(err, "already exists (not replaced)")) fail_msg("%s", err);
    assert_false(file_exists(bin));
    assert_int_equal(count_dir_entries(), 1);

    assert_int_equal(write_one(prefix, 9, 5, true, err, sizeof(err)), 0);
    IndexedDataset ds;
    assert_int_equal(indexed_dataset_open(&ds, prefix, err, sizeof(err)), 0);
    int32_t got[5];
    indexed_dataset_read(&ds, 0, 0, 5, got);
    for (int k = 0; k < 5; k++) assert_int_equal(got[k], 9);
    indexed_dataset_close(&ds);
    assert_int_equal(count_dir_entries(), 2);
}

/* `docs` documents of `len` uint16 tokens each, token t of document d = (d * 31 + t) % 50000, except that token
 * `at` of the whole stream is `value` (at < 0: none); under prefix (replacing it). The fingerprint of what it wrote. */
static DatasetFingerprint write_docs(const char *prefix, int docs, int len, long at, int32_t value) {
    char err[512];
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_UINT16, err, sizeof(err));
    assert_non_null(w);
    indexed_dataset_writer_set_overwrite(w, true);
    int32_t *tokens = malloc((size_t)len * sizeof *tokens);
    for (int d = 0; d < docs; d++) {
        for (int t = 0; t < len; t++) {
            const long i = (long)d * len + t;
            tokens[t] = i == at ? value : (d * 31 + t) % 50000;
        }
        assert_int_equal(indexed_dataset_writer_add_document(w, tokens, len), 0);
    }
    free(tokens);
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof(err)), 0);
    IndexedDataset ds;
    assert_int_equal(indexed_dataset_open(&ds, prefix, err, sizeof(err)), 0);
    const DatasetFingerprint fp = indexed_dataset_fingerprint(&ds, NULL);
    indexed_dataset_close(&ds);
    return fp;
}

static bool same_fingerprint(DatasetFingerprint a, DatasetFingerprint b) {
    return a.documents == b.documents && a.idx_bytes == b.idx_bytes && a.bin_bytes == b.bin_bytes &&
           a.crc32c == b.crc32c;
}

/* The fingerprint: as documented for a small dataset (the CRC of the whole .idx, then the whole .bin); the same
 * contents at another path give the same one; another token or one document more another one; in a .bin over
 * 2 MiB, a token changed outside its first and last MiB goes unseen (the stated blind spot) and one in its last
 * MiB does not; a loss mask's files are folded in. */
static void test_fingerprint(void **state) {
    (void)state;
    char a[512], b[512], mask[600], err[512];
    strcpy(a, in_work("a"));
    strcpy(b, in_work("b"));
    const DatasetFingerprint small = write_docs(a, 3, 10, -1, 0);
    char path[600];
    snprintf(path, sizeof path, "%s.idx", a);
    Bytes idx = read_whole(path);
    snprintf(path, sizeof path, "%s.bin", a);
    Bytes bin = read_whole(path);
    assert_int_equal(small.documents, 3);
    assert_int_equal(small.idx_bytes, idx.len);
    assert_int_equal(small.bin_bytes, 60);
    assert_int_equal(small.crc32c, crc32c(crc32c(0, idx.data, idx.len), bin.data, bin.len));
    assert_true(same_fingerprint(write_docs(b, 3, 10, -1, 0), small));
    DatasetFingerprint other = write_docs(b, 3, 10, 17, 7); /* one token */
    assert_int_equal(other.documents, 3);
    assert_int_equal(other.bin_bytes, 60);
    assert_int_not_equal(other.crc32c, small.crc32c);
    assert_int_equal(write_docs(b, 4, 10, -1, 0).documents, 4);

    enum { DOCS = 1600, LEN = 1000 }; /* 3.2 MB of uint16 tokens */
    const DatasetFingerprint big = write_docs(a, DOCS, LEN, -1, 0);
    assert_int_equal(big.bin_bytes, 2 * DOCS * LEN);
    assert_true(same_fingerprint(write_docs(b, DOCS, LEN, DOCS * LEN / 2, 7), big)); /* the middle: unseen */
    assert_int_not_equal(write_docs(b, DOCS, LEN, DOCS * LEN - 10, 7).crc32c, big.crc32c); /* the last MiB */
    assert_int_not_equal(write_docs(b, DOCS, LEN, 10, 7).crc32c, big.crc32c);            /* the first */

    snprintf(mask, sizeof mask, "%s_mask", a); /* a mask of the small dataset's shape */
    write_docs(a, 3, 10, -1, 0);
    IndexedDatasetWriter *w = indexed_dataset_writer_open(mask, IDX_DTYPE_UINT8, err, sizeof(err));
    assert_non_null(w);
    const int32_t ones[10] = {1, 1, 1, 1, 1, 0, 0, 1, 1, 1};
    for (int d = 0; d < 3; d++) assert_int_equal(indexed_dataset_writer_add_document(w, ones, 10), 0);
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof(err)), 0);
    IndexedDataset ds, m;
    assert_int_equal(indexed_dataset_open(&ds, a, err, sizeof(err)), 0);
    assert_int_equal(indexed_dataset_open(&m, mask, err, sizeof(err)), 0);
    const DatasetFingerprint masked = indexed_dataset_fingerprint(&ds, &m);
    assert_int_equal(masked.documents, 3);
    assert_int_equal(masked.idx_bytes, small.idx_bytes + m.idx_map_size);
    assert_int_equal(masked.bin_bytes, 60 + 30);
    assert_int_not_equal(masked.crc32c, small.crc32c);
    assert_true(same_fingerprint(indexed_dataset_fingerprint(&ds, NULL), small));
    indexed_dataset_close(&m);
    indexed_dataset_close(&ds);
}

/* The fingerprint reads the .bin's ends ahead in large reads: the loader advises MADV_RANDOM before it takes the
 * fingerprint, and without the read-ahead each page of a cold file was a read of its own (512 a MiB, measured as
 * major page faults; thousands of synchronous reads for a blend of shards on a network file system). Where /tmp
 * keeps no page cache of its own (tmpfs) there are no major faults either way. */
static void evict(const char *path) {
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

static void test_fingerprint_reads_ahead(void **state) {
    (void)state;
    char a[512], path[600], err[512];
    strcpy(a, in_work("a"));
    const DatasetFingerprint fp = write_docs(a, 4000, 1000, -1, 0); /* 8 MB of uint16 tokens */
    snprintf(path, sizeof path, "%s.bin", a);
    evict(path);
    snprintf(path, sizeof path, "%s.idx", a);
    evict(path);
    IndexedDataset ds;
    assert_int_equal(indexed_dataset_open(&ds, a, err, sizeof(err)), 0);
    indexed_dataset_advise_random(&ds); /* as data_loader.c's open_sources does */
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    assert_true(same_fingerprint(indexed_dataset_fingerprint(&ds, NULL), fp));
    getrusage(RUSAGE_SELF, &after);
    indexed_dataset_close(&ds);
    const long faults = after.ru_majflt - before.ru_majflt;
    if (faults >= 64) fail_msg("%ld major page faults to read 2 MiB of a cold .bin (one per page: no read-ahead)", faults);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_uint16, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_int32, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hand_written_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_int64_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_rejects_and_aborts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_overwrite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fingerprint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fingerprint_reads_ahead, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
