/* fuzz_hf_config.c: libFuzzer harness for Hugging Face config.json
 * (src/convert/hf_config.c): both RoPE spellings, every field's type and
 * range, the families. A config that parses and can be exported must be
 * written by hf_config_to_json to a text that parses to the same config. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/hf_config.h"
#include "core/error.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    mt_log_enabled = 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[2048] = "";
    static ModelConfig cfg, again;
    memset(&cfg, 0, sizeof cfg);
    if (hf_config_parse((const char *)data, size, "config.json", &cfg, err, sizeof err) != 0) {
        if (!err[0]) fuzz_fail("hf_config_parse failed without a message");
        return 0;
    }
    if (hf_config_check_exportable(&cfg, err, sizeof err) != 0) return 0;
    char *text = hf_config_to_json(&cfg, "float32");
    memset(&again, 0, sizeof again);
    if (hf_config_parse(text, strlen(text), "written config.json", &again, err, sizeof err) != 0)
        fuzz_fail("the written config does not parse: %s\n%s", err, text);
    char *text2 = hf_config_to_json(&again, "float32");
    if (strcmp(text, text2) != 0) fuzz_fail("the written config reads back differently:\n%s\n--- again:\n%s", text, text2);
    free(text);
    free(text2);
    return 0;
}
