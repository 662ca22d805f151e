/* fuzz_dataset_record.c: libFuzzer harness for PREFIX.build.json, the record
 * of the tokenizer that made a dataset (src/data/dataset_tokenizer.c), which
 * run, resume and eval read beside any dataset a user points them at. An
 * accepted record's fields lie in their ranges (a byte-level one without
 * size or CRC); a refused one is named in the message. */
#include <stdint.h>
#include <string.h>

#include "data/dataset_tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char path[] = "fuzz.build.json";
    DatasetTokenizer tok;
    char err[1024] = "";
    if (dataset_tokenizer_parse((const char *)data, size, path, &tok, err, sizeof err) != 0) {
        if (strncmp(err, "fuzz.build.json: ", strlen(path) + 2) != 0) fuzz_fail("error without the file: '%s'", err);
        return 0;
    }
    if (tok.vocab_size < 0 || tok.vocab_size > INT32_MAX || tok.eod < -1 || tok.eod > INT32_MAX)
        fuzz_fail("accepted vocab_size %lld, eod %lld", (long long)tok.vocab_size, (long long)tok.eod);
    if (tok.byte && (tok.bytes != 0 || tok.crc32c != 0)) fuzz_fail("a byte-level record with a size or CRC");
    return 0;
}
