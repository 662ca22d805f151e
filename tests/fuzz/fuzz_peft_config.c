/* fuzz_peft_config.c: libFuzzer harness for PEFT's adapter_config.json
 * (src/convert/peft_config.c): every key's type and range, the target
 * spellings (paths checked against a base of 4 layers), the refusals. A refused config says why, naming the file; an
 * accepted one is written by peft_config_to_json to a text that reads back
 * as the same adapters and base model. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/peft_config.h"
#include "core/error.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    mt_log_enabled = 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[2048] = "", note[512], base[1024], base2[1024];
    PeftConfig peft, again;
    if (peft_config_parse((const char *)data, size, "adapter_config.json", 4, &peft, base, sizeof base, note,
                          sizeof note, err, sizeof err) != 0) {
        if (strncmp(err, "adapter_config.json: ", 21) != 0) fuzz_fail("a refusal that does not name the file: '%s'", err);
        return 0;
    }
    if (peft.rank < 1 || !(peft.alpha > 0) || peft.targets == 0 || peft.targets > LORA_ALL_TARGETS || peft.dropout != 0)
        fuzz_fail("accepted adapters out of range: rank %d alpha %g targets %#x", peft.rank, peft.alpha, peft.targets);
    if (memchr(base, '\0', sizeof base) == NULL) fuzz_fail("the base model's name is not terminated");
    char *text = peft_config_to_json(&peft, base[0] ? base : NULL);
    if (peft_config_parse(text, strlen(text), "written adapter_config.json", 4, &again, base2, sizeof base2, note,
                          sizeof note, err, sizeof err) != 0)
        fuzz_fail("the written config does not parse: %s\n%s", err, text);
    if (again.rank != peft.rank || again.alpha != peft.alpha || again.targets != peft.targets || strcmp(base, base2))
        fuzz_fail("the written config reads back differently:\n%s", text);
    free(text);
    return 0;
}
