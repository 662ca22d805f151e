/* test_json.c: the JSON reader and writer (src/core/json.h): values, nesting,
 * escapes and numbers parsed right; invalid input rejected with a located
 * message (and every truncation or random mutation of a document handled
 * without a crash); output compact and Python-indented; doubles spelled as
 * Python's repr spells them and read back exactly. */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/json.h"
#include "core/rng.h"

static JsonValue *parse(const char *text) {
    char err[256];
    JsonValue *v = json_parse(text, strlen(text), err, sizeof err);
    if (!v) fail_msg("unexpected parse error for %s: %s", text, err);
    return v;
}

static void test_values_and_nesting(void **state) {
    (void)state;
    JsonValue *v = parse(" {\"a\": [1, -2, 3.5, true, false, null, {\"b\": {}}, []], \"c\": \"x\", \"a2\": {\"d\": [[]]}} ");
    assert_int_equal(v->type, JSON_OBJECT);
    assert_int_equal(v->count, 3);
    const JsonValue *a = json_get(v, "a");
    assert_non_null(a);
    assert_int_equal(a->type, JSON_ARRAY);
    assert_int_equal(a->count, 8);
    assert_true(a->items[0]->is_integer);
    assert_int_equal(a->items[0]->integer, 1);
    assert_int_equal(a->items[1]->integer, -2);
    assert_false(a->items[2]->is_integer);
    assert_true(a->items[2]->number == 3.5);
    assert_int_equal(a->items[3]->type, JSON_BOOL);
    assert_true(a->items[3]->boolean);
    assert_false(a->items[4]->boolean);
    assert_int_equal(a->items[5]->type, JSON_NULL);
    const JsonValue *b = json_get(a->items[6], "b");
    assert_non_null(b);
    assert_int_equal(b->type, JSON_OBJECT);
    assert_int_equal(b->count, 0);
    assert_int_equal(a->items[7]->type, JSON_ARRAY);
    assert_int_equal(a->items[7]->count, 0);
    assert_string_equal(json_get(v, "c")->string, "x");
    const JsonValue *d = json_get(json_get(v, "a2"), "d");
    assert_int_equal(d->count, 1);
    assert_int_equal(d->items[0]->count, 0);
    assert_null(json_get(v, "missing"));
    assert_null(json_get(a, "a")); /* not an object */
    json_free(v);

    /* A repeated key: the last one wins, as in Python; both are kept. */
    v = parse("{\"k\": 1, \"k\": 2}");
    assert_int_equal(v->count, 2);
    assert_int_equal(json_get(v, "k")->integer, 2);
    json_free(v);

    /* Deep but allowed nesting. */
    char deep[2 * JSON_MAX_DEPTH + 1];
    memset(deep, '[', JSON_MAX_DEPTH);
    memset(deep + JSON_MAX_DEPTH, ']', JSON_MAX_DEPTH);
    deep[2 * JSON_MAX_DEPTH] = '\0';
    v = parse(deep);
    json_free(v);
}

static void test_escapes_and_utf8(void **state) {
    (void)state;
    JsonValue *v = parse("\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9 \\u20AC \\ud83d\\ude00 \\ud800x \xc3\xa9\"");
    const char expected[] = "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbdx \xc3\xa9";
    assert_int_equal(v->string_len, sizeof expected - 1);
    assert_memory_equal(v->string, expected, sizeof expected - 1);
    json_free(v);
    /* \u0000 is kept: the length says where the string ends. */
    v = parse("{\"a\\u0000b\": \"c\\u0000d\"}");
    assert_int_equal(v->members[0].key_len, 3);
    assert_int_equal(v->members[0].value->string_len, 3);
    assert_memory_equal(v->members[0].value->string, "c\0d", 3);
    json_free(v);
}

static void test_numbers(void **state) {
    (void)state;
    static const struct {
        const char *text;
        double value;
        int is_integer;
    } cases[] = {
        {"0", 0, 1}, {"-0", -0.0, 1}, {"12", 12, 1}, {"-12", -12, 1}, {"1.5", 1.5, 0}, {"1e3", 1000, 0},
        {"1E-3", 1e-3, 0}, {"-2.5e+2", -250, 0}, {"0.02", 0.02, 0}, {"1e-05", 1e-5, 0},
        {"9223372036854775807", 9223372036854775807.0, 1}, {"9223372036854775808", 9223372036854775808.0, 0},
        {"1e400", INFINITY, 0}, {"Infinity", INFINITY, 0}, {"-Infinity", -INFINITY, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        JsonValue *v = parse(cases[i].text);
        assert_int_equal(v->type, JSON_NUMBER);
        assert_true(v->number == cases[i].value);
        assert_int_equal(v->is_integer, cases[i].is_integer);
        json_free(v);
    }
    JsonValue *v = parse("NaN");
    assert_true(isnan(v->number));
    json_free(v);
    v = parse("9223372036854775807");
    assert_true(v->integer == INT64_MAX);
    json_free(v);
    int64_t out;
    v = parse("[3.0, 3.5, 1e300, -7]");
    assert_int_equal(json_as_int64(v->items[0], &out), 0);
    assert_int_equal(out, 3);
    assert_int_equal(json_as_int64(v->items[1], &out), -1);
    assert_int_equal(json_as_int64(v->items[2], &out), -1);
    assert_int_equal(json_as_int64(v->items[3], &out), 0);
    assert_int_equal(out, -7);
    json_free(v);
}

static void test_invalid(void **state) {
    (void)state;
    static const struct {
        const char *text;
        const char *message; /* a piece of the expected message */
    } cases[] = {
        {"", "column 1: expected a JSON value"},
        {"   ", "expected a JSON value, found the end"},
        {"{", "member name"},
        {"[1,]", "column 4: expected a JSON value, found ']'"},
        {"{\"a\":1,}", "member name"},
        {"{a:1}", "member name"},
        {"01", "end of the text after the JSON value"},
        {"1.", "a digit after the decimal point"},
        {".5", "expected a JSON value"},
        {"1e", "a digit in the exponent"},
        {"-", "a digit after '-'"},
        {"+1", "expected a JSON value"},
        {"tru", "expected a JSON value"},
        {"nul", "expected a JSON value"},
        {"\"abc", "closing '\"'"},
        {"\"\\x\"", "a valid escape"},
        {"\"\\u12G4\"", "four hex digits"},
        {"\"tab\there\"", "control characters"},
        {"[1 2]", "',' or ']'"},
        {"{\"a\" 1}", "':'"},
        {"{\"a\":}", "expected a JSON value, found '}'"},
        {"1 2", "end of the text"},
        {"\"\xff\"", "valid UTF-8"},
        {"\"\xc0\xaf\"", "valid UTF-8"},
        {"\"\xed\xa0\x80\"", "valid UTF-8"},
        {"\"\xe2\x82\"", "valid UTF-8"},
        {"NaNa", "end of the text"},
        {"[1]\n\n  }", "line 3, column 3: expected the end of the text"},
        {"{\n  \"a\": [1,\n   2,,]}", "line 3, column 6"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        JsonValue *v = json_parse(cases[i].text, strlen(cases[i].text), err, sizeof err);
        if (v) fail_msg("accepted invalid JSON: %s", cases[i].text);
        if (!strstr(err, cases[i].message))
            fail_msg("for %s: message '%s' lacks '%s'", cases[i].text, err, cases[i].message);
    }
    /* Nesting deeper than the limit. */
    size_t n = JSON_MAX_DEPTH + 1;
    char *deep = malloc(2 * n + 1);
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    char err[256];
    assert_null(json_parse(deep, 2 * n, err, sizeof err));
    assert_non_null(strstr(err, "levels of nesting"));
    free(deep);
}

/* Reading stops at len: the bytes after it (here: no terminator at all) are never looked at. */
static void test_length_bounds(void **state) {
    (void)state;
    char err[256];
    const char *text = "123456";
    JsonValue *v = json_parse(text, 3, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(v->integer, 123);
    json_free(v);
    char *exact = malloc(4);
    memcpy(exact, "[1,2", 4); /* no NUL: a read past the end would be a bug (visible under ASan/valgrind) */
    assert_null(json_parse(exact, 4, err, sizeof err));
    memcpy(exact, "\"ab\\", 4);
    assert_null(json_parse(exact, 4, err, sizeof err));
    memcpy(exact, "\"\\u1", 4);
    assert_null(json_parse(exact, 4, err, sizeof err));
    free(exact);
}

static const char document[] =
    "{\"__metadata__\": {\"format\": \"pt\"}, \"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], "
    "\"data_offsets\": [0, 24]}, \"s\": \"\\u00e9\\n\", \"n\": [-1.5e-3, true, null]}";

/* Every proper prefix of an object is invalid; random byte mutations never crash. */
static void test_truncations_and_mutations(void **state) {
    (void)state;
    char err[256];
    size_t len = strlen(document);
    JsonValue *whole = json_parse(document, len, err, sizeof err);
    assert_non_null(whole);
    json_free(whole);
    for (size_t cut = 0; cut < len; cut++) {
        JsonValue *v = json_parse(document, cut, err, sizeof err);
        if (v) fail_msg("accepted a truncation at %zu", cut);
        assert_true(strlen(err) > 0);
    }
    Rng rng;
    rng_seed(&rng, 7);
    char *copy = malloc(len);
    int accepted = 0;
    for (int trial = 0; trial < 20000; trial++) {
        memcpy(copy, document, len);
        int edits = 1 + (int)(rng_next_u64(&rng) % 3);
        for (int e = 0; e < edits; e++) copy[rng_next_u64(&rng) % len] = (char)(rng_next_u64(&rng) & 0xFF);
        JsonValue *v = json_parse(copy, len, err, sizeof err);
        if (v) accepted++;
        json_free(v);
    }
    /* Most mutations break the document; some (inside strings) do not. */
    assert_true(accepted > 0 && accepted < 20000);
    free(copy);
}

static void test_writer(void **state) {
    (void)state;
    JsonWriter w;
    jw_init(&w, 0);
    jw_begin_object(&w);
    jw_key(&w, "a");
    jw_begin_array(&w);
    jw_int(&w, 1);
    jw_int(&w, -2);
    jw_begin_object(&w);
    jw_end_object(&w);
    jw_end_array(&w);
    jw_key(&w, "b");
    jw_begin_object(&w);
    jw_key(&w, "c");
    jw_null(&w);
    jw_key(&w, "d");
    jw_begin_array(&w);
    jw_end_array(&w);
    jw_end_object(&w);
    jw_key(&w, "e");
    jw_string(&w, "q\"b\\s\n\x01");
    jw_key(&w, "f");
    jw_double(&w, 10000.0);
    jw_key(&w, "g");
    jw_bool(&w, false);
    jw_end_object(&w);
    assert_string_equal(w.data, "{\"a\":[1,-2,{}],\"b\":{\"c\":null,\"d\":[]},\"e\":\"q\\\"b\\\\s\\n\\u0001\",\"f\":10000.0,"
                                "\"g\":false}");
    char err[256];
    JsonValue *v = json_parse(w.data, w.len, err, sizeof err);
    assert_non_null(v);
    assert_string_equal(json_get(v, "e")->string, "q\"b\\s\n\x01");
    json_free(v);
    jw_free(&w);

    /* Indented like Python's json.dumps(..., indent=2). */
    jw_init(&w, 2);
    jw_begin_object(&w);
    jw_key(&w, "a");
    jw_begin_array(&w);
    jw_int(&w, 1);
    jw_int(&w, 2);
    jw_begin_object(&w);
    jw_end_object(&w);
    jw_end_array(&w);
    jw_key(&w, "b");
    jw_begin_object(&w);
    jw_key(&w, "c");
    jw_null(&w);
    jw_key(&w, "d");
    jw_begin_array(&w);
    jw_end_array(&w);
    jw_end_object(&w);
    jw_key(&w, "e");
    jw_string(&w, "x");
    jw_end_object(&w);
    assert_string_equal(w.data, "{\n  \"a\": [\n    1,\n    2,\n    {}\n  ],\n  \"b\": {\n    \"c\": null,\n    \"d\": []\n"
                                "  },\n  \"e\": \"x\"\n}");
    jw_free(&w);
}

static void test_double_format(void **state) {
    (void)state;
    /* Python's repr of each value. */
    static const struct {
        double value;
        const char *text;
    } cases[] = {
        {10000.0, "10000.0"}, {1e-05, "1e-05"}, {0.02, "0.02"}, {1e16, "1e+16"}, {1.5e-7, "1.5e-07"},
        {123456789.0, "123456789.0"}, {0.0001, "0.0001"}, {0.00001234, "1.234e-05"}, {-0.0, "-0.0"},
        {0.1, "0.1"}, {1.0 / 3.0, "0.3333333333333333"}, {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"}, {500000.0, "500000.0"},
        {9007199254740992.0, "9007199254740992.0"}, {1e15, "1000000000000000.0"},
        {1e-4 * 0.99, "9.900000000000001e-05"}, {123.456e20, "1.23456e+22"}, {8.0, "8.0"}, {0.0, "0.0"},
    };
    char text[40];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_format_double(text, sizeof text, cases[i].value);
        assert_string_equal(text, cases[i].text);
    }
    /* Random doubles of every magnitude read back exactly. */
    Rng rng;
    rng_seed(&rng, 11);
    for (int i = 0; i < 20000; i++) {
        uint64_t bits = rng_next_u64(&rng);
        double value;
        memcpy(&value, &bits, sizeof value);
        if (!isfinite(value)) continue;
        json_format_double(text, sizeof text, value);
        char err[128];
        JsonValue *v = json_parse(text, strlen(text), err, sizeof err);
        if (!v) fail_msg("%s does not parse: %s", text, err);
        if (memcmp(&v->number, &value, sizeof value) != 0) fail_msg("%s read back differently", text);
        json_free(v);
    }
}

/* utf8_valid: text a recipe or adapter_config.json can hold (a path of any bytes may not be) */
static void test_utf8_valid(void **state) {
    (void)state;
    static const struct {
        const char *s;
        bool valid;
    } cases[] = {
        {"", true}, {"/runs/a b\n\"c\"", true}, {"caf\xc3\xa9", true}, {"\xe2\x82\xac \xf0\x9f\x98\x80", true},
        {"bad\xff" "dir", false}, /* not a UTF-8 byte */
        {"\xc3", false},            /* cut short */
        {"\xc0\xaf", false},        /* overlong '/' */
        {"\xed\xa0\x80", false},    /* a surrogate */
        {"\xf4\x90\x80\x80", false}, /* above U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (utf8_valid(cases[i].s, strlen(cases[i].s)) != cases[i].valid) fail_msg("case %zu", i);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_and_nesting),
        cmocka_unit_test(test_escapes_and_utf8),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_length_bounds),
        cmocka_unit_test(test_truncations_and_mutations),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_double_format),
        cmocka_unit_test(test_utf8_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
