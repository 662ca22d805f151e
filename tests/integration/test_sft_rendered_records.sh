#!/usr/bin/env bash
# test_sft_rendered_records.sh: the advice `data build --format sft` gives for a
# chat template it does not render (a custom chatml with its own system prompt,
# which --chat-template auto refuses and a named template warns of; a Llama 3
# template with a pirate's, built as Llama 3's with a warning) is followed literally with transformers' apply_chat_template
# on the Qwen2 and Llama 3 fixture tokenizers: "prompt" = the rendering of
# messages[:-1] with the generation prompt, "completion" = the rest of the
# whole rendering cut before its last end-of-turn token, built without a
# template (the tokenizer_config.json's eos_token, the end of turn, appended).
# The dataset's ids are then the template's ids of the conversation up to and
# including that end-of-turn token (one end of turn, not two), and the loss
# mask counts exactly the completion and its end of turn.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_python torch
FIX="$REPO/tests/fixtures/tokenizers"
TPL="$REPO/tests/fixtures/chat_templates/templates"

cat > "$WORK/chat.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "Four."}]}
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, like <|im_end|> text."}]}
{"messages": [{"role": "user", "content": "Count: one two"}, {"role": "assistant", "content": " three\nfour "}]}
JSONL

# model DIR FIXTURE EOT BOS: a model directory with FIXTURE's tokenizer, the chat template in $WORK/DIR.jinja, EOT as
# its eos_token and BOS (JSON) its bos_token
model() {
  mkdir -p "$WORK/$1" && cp "$FIX/$2/tokenizer.json" "$WORK/$1/" && cp "$WORK/$1.jinja" "$WORK/$1/chat_template.jinja"
  printf '{"eos_token": "%s", "bos_token": %s, "tokenizer_class": "PreTrainedTokenizerFast"}\n' "$3" "$4" \
    > "$WORK/$1/tokenizer_config.json"
}
sed 's/You are Qwen, created by Alibaba Cloud. You are a helpful assistant./You are MegaBot, a friendly pirate assistant./' \
  "$TPL/chatml.jinja" > "$WORK/megabot.jinja"
{ printf '%s' "{%- if messages[0]['role'] != 'system' %}{{- '<|start_header_id|>system<|end_header_id|>\n\nYou are a \
pirate.<|eot_id|>' }}{%- endif %}"; cat "$TPL/llama3.jinja"; } > "$WORK/pirate.jinja"
model megabot qwen2 '<|im_end|>' null
model pirate llama3 '<|eot_id|>' '"<|begin_of_text|>"'

# megabot is none of the four (auto refuses it, a named template warns); pirate is llama3's by its marks with prose
# of its own (auto and llama3 build it as the published template, with a warning): each message gives the advice
for spec in "megabot|chatml|2|<|im_end|>" "pirate|llama3|0|<|eot_id|>"; do
  IFS="|" read -r name named auto_rc eot <<< "$spec" # (eot, last, keeps its "|")
  rc=0; "$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$WORK/$name" --input "$WORK/chat.jsonl" \
    --output "$WORK/$name-auto" > /dev/null 2> "$WORK/auto.err" || rc=$?
  [[ $rc -eq $auto_rc ]] || fail "$name: auto: exit $rc (expected $auto_rc): $(cat "$WORK/auto.err")"
  "$MEGATRAIN" data build --format sft --chat-template "$named" --tokenizer "$WORK/$name" --input "$WORK/chat.jsonl" \
    --output "$WORK/$name-named" > /dev/null 2> "$WORK/named.err" || fail "$name: --chat-template $named failed"
  [[ $name != megabot ]] || grep -qF "warning: data build: --chat-template $named, but the model's own template \
($WORK/$name/chat_template.jinja) is none of those megatrain recognizes" "$WORK/named.err" ||
    fail "$name: --chat-template $named: no warning: $(cat "$WORK/named.err")"
  for f in auto named; do
    grep -qF '"prompt" is transformers'"' apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True), \"completion\" the rest of apply_chat_template(messages, tokenize=False) after it, cut before its last end-of-turn token" \
      "$WORK/$f.err" || fail "$name: $f: not the advice checked here: $(cat "$WORK/$f.err")"
  done
  # following it
  "$PY" - "$WORK/$name" "$WORK/chat.jsonl" "$WORK/$name.jsonl" "$WORK/$name.want.json" "$eot" <<'PY'
import json, sys
from transformers import AutoTokenizer
model, chats, records, want, eot = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(model)  # its chat_template.jinja
expected = []
with open(records, "w") as out:
    for line in open(chats):
        messages = json.loads(line)["messages"]
        prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        whole = tok.apply_chat_template(messages, tokenize=False)
        assert whole.startswith(prompt), (prompt, whole)
        rest = whole[len(prompt):]
        completion = rest[:rest.rindex(eot)]
        out.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
        ids = tok(whole[:len(prompt) + len(completion) + len(eot)], add_special_tokens=False)["input_ids"]
        masked = len(tok(prompt, add_special_tokens=False)["input_ids"])
        expected.append({"ids": ids, "mask": [0] * masked + [1] * (len(ids) - masked)})
json.dump(expected, open(want, "w"))
PY
  "$MEGATRAIN" data build --format sft --tokenizer "$WORK/$name" --input "$WORK/$name.jsonl" --output "$WORK/$name-rendered" \
    > "$WORK/build.log" 2>&1 || fail "$name: building the rendered records: $(cat "$WORK/build.log")"
  grep -qF "end of document = $eot" "$WORK/build.log" || fail "$name: not $eot appended: $(cat "$WORK/build.log")"
  "$MEGATRAIN" data inspect "$WORK/$name-rendered" --tokenizer "$WORK/$name" --docs 3 --json > "$WORK/inspect.json"
  "$PY" - "$WORK/inspect.json" "$WORK/$name.want.json" "$name" <<'PY' || fail "$name: the rendered records' ids or mask differ"
import json, sys
got = json.load(open(sys.argv[1]))["first_documents"]
want = json.load(open(sys.argv[2]))
assert len(got) == len(want) == 3, (len(got), len(want))
for i, (g, w) in enumerate(zip(got, want)):
    if g["ids"] != w["ids"]:
        sys.exit(f"{sys.argv[3]}: record {i}: ids {g['ids']}\n  the template's {w['ids']}")
    if g["mask"] != w["mask"]:
        sys.exit(f"{sys.argv[3]}: record {i}: mask {g['mask']}\n  expected {w['mask']}")
print(f"{sys.argv[3]}: 3 records, ids and masks as the template's")
PY
done
echo "ok"
