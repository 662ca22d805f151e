#!/usr/bin/env bash
# test_data_build_sft.sh: `megatrain data build --format sft` renders
# prompt/completion and messages records with the llama3, llama3.1, chatml and qwen3 chat
# templates into the exact text the published Jinja templates give (checked
# byte for byte with the byte tokenizer), writes the loss mask
# PREFIX_mask.{bin,idx} with 1 exactly on assistant/completion tokens and
# their end of turn, tokenizes with a real tokenizer.json into the same ids
# as the whole rendered text (special tokens as single ids), and `data
# inspect` shows the masked fraction. Bad records stop the build naming the
# file and line (exit 1); a template that does not exist is a usage error (exit 2).
# Empty assistant replies are counted and warned of, naming the first line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
D="$WORK"
FIX="$REPO/tests/fixtures/tokenizers"

cat > "$D/chat.jsonl" <<'JSONL'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": " Four.\n"}]}

{"prompt": "Name a colour.", "completion": "Blue"}
{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you."}]}
JSONL

# idx_reader.read(PREFIX, BYTES, FORMAT): a dataset's documents as lists of numbers (struct FORMAT, BYTES each).
cat > "$D/idx_reader.py" <<'PY'
import struct
def read(prefix, size, fmt):
    idx = open(prefix + ".idx", "rb").read()
    n = struct.unpack_from("<Q", idx, 18)[0]
    lengths = struct.unpack_from("<%di" % n, idx, 34)
    data = open(prefix + ".bin", "rb").read()
    vals = struct.unpack("<%d%s" % (len(data) // size, fmt), data)
    out, at = [], 0
    for l in lengths:
        out.append(list(vals[at:at + l])); at += l
    return out
PY
export PYTHONPATH="$D${PYTHONPATH:+:$PYTHONPATH}"
# check_rendering TEMPLATE: the documents' bytes and masks against expected
# renderings, where [..] marks the counted spans.
check_rendering() {
  "$MEGATRAIN" data build --format sft --chat-template "$1" --input "$D/chat.jsonl" --output "$D/out/$1" > "$D/log.txt" ||
    fail "$1: data build failed"
  python3 - "$D/out/$1" "$1" <<'PY' || fail "$1: rendering or mask differs"
import struct, sys
prefix, template = sys.argv[1], sys.argv[2]
from idx_reader import read
docs, masks = read(prefix, 2, "H"), read(prefix + "_mask", 1, "B")
L = {"llama3": [
  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Four.<|eot_id|>]",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Blue<|eot_id|>]",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Hello!<|eot_id|>]<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[See you.<|eot_id|>]"],
 "llama3.1": [
  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Four.<|eot_id|>]",
  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Blue<|eot_id|>]",
  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Hello!<|eot_id|>]<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[See you.<|eot_id|>]"],
 "chatml": [
  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n[ Four.\n<|im_end|>]\n",
  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n[Blue<|im_end|>]\n",
  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n[Hello!<|im_end|>]\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n[See you.<|im_end|>]\n"],
 "qwen3": [
  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n[ Four.\n<|im_end|>]\n",
  "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n[Blue<|im_end|>]\n",
  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n[Hello!<|im_end|>]\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n[See you.<|im_end|>]\n"]}[template]
assert len(docs) == 3, len(docs)
for d, m, want in zip(docs, masks, L):
    text, mask, counted = b"", [], 0
    for ch in want:
        if ch in "[]": counted = ch == "["; continue
        text += ch.encode(); mask.append(int(counted))
    assert bytes(d) == text, (bytes(d), text)
    assert m == mask, (m, mask)
PY
  grep -q "chat template $1" "$D/log.txt" || fail "$1: summary: $(cat "$D/log.txt")"
}
check_rendering llama3
check_rendering chatml
check_rendering qwen3
check_rendering llama3.1

# --- data inspect: the masked fraction --------------------------------------
"$MEGATRAIN" data inspect "$D/out/llama3" --docs 0 > "$D/inspect.txt"
counted=$(od -An -v -tu1 "$D/out/llama3_mask.bin" | tr -s ' ' '\n' | grep -c '^1$')
total=$(stat -c %s "$D/out/llama3_mask.bin")
grep -q "loss mask: $D/out/llama3_mask.{bin,idx}: $counted of $total tokens counted" "$D/inspect.txt" ||
  fail "inspect: $(cat "$D/inspect.txt") (expected $counted of $total)"
"$MEGATRAIN" data inspect "$D/out/llama3" --docs 0 --json > "$D/inspect.json" # (not grep -q on a pipe: SIGPIPE)
grep -q "\"loss_mask\":{\"counted_tokens\":$counted," "$D/inspect.json" || fail "inspect --json lacks the loss mask"
# --json lists each shown document's mask beside its ids: the mask file's bytes
"$MEGATRAIN" data inspect "$D/out/llama3" --docs 3 --json > "$D/inspect3.json"
python3 - "$D/inspect3.json" "$D/out/llama3_mask.bin" <<'PY' || fail "inspect --json: the documents' masks differ from the mask file"
import json, sys
docs = json.load(open(sys.argv[1]))["first_documents"]
mask = list(open(sys.argv[2], "rb").read())
assert len(docs) == 3 and all(len(d["mask"]) == len(d["ids"]) for d in docs), docs
assert sum((d["mask"] for d in docs), []) == mask
PY
# a mask of another dataset is refused by name
cp "$D/out/chatml_mask.bin" "$D/out/llama3_mask.bin"; cp "$D/out/chatml_mask.idx" "$D/out/llama3_mask.idx"
if "$MEGATRAIN" data inspect "$D/out/llama3" 2> "$D/err.txt"; then fail "a mismatched mask was accepted"; fi
grep -q "llama3_mask.idx: the loss mask of .* does not match it" "$D/err.txt" || fail "mismatch: $(cat "$D/err.txt")"

# --- without a template: prompt masked, completion + end of document counted --
printf '{"prompt": "ab", "completion": "cd"}\n' > "$D/pc.jsonl"
"$MEGATRAIN" data build --format sft --input "$D/pc.jsonl" --output "$D/out/pc" > /dev/null
[[ $(od -An -v -tu2 "$D/out/pc.bin" | xargs) == "97 98 99 100 10" ]] || fail "pc tokens: $(od -An -tu2 "$D/out/pc.bin")"
[[ $(od -An -v -tu1 "$D/out/pc_mask.bin" | xargs) == "0 0 1 1 1" ]] || fail "pc mask: $(od -An -tu1 "$D/out/pc_mask.bin")"
# the summary's counts over more batches than the build's ring of 2 x workers + 2 slots holds (10 MiB with one
# worker: its slots are reused, and a count left from a slot's last batch would be added again) are the mask's own
python3 - "$D/big.jsonl" <<'PY'
import json, random, sys
random.seed(5)
words = "the quick brown fox jumps over a lazy dog by river tree stone far mat sat ran cat on".split()
with open(sys.argv[1], "w") as f:
    while f.tell() < 10 << 20:
        f.write(json.dumps({"prompt": " ".join(random.choices(words, k=random.randint(5, 25))),
                            "completion": " ".join(random.choices(words, k=random.randint(3, 12)))}) + "\n")
PY
"$MEGATRAIN" data build --format sft --workers 1 --input "$D/big.jsonl" --output "$D/out/big" > "$D/big.txt" 2>&1 ||
  { cat "$D/big.txt"; fail "the 10 MiB SFT build failed"; }
want=$(python3 -c 'import sys; m = open(sys.argv[1], "rb").read(); print(f"{m.count(1)} of {len(m)} tokens counted")' \
  "$D/out/big_mask.bin")
grep -q "; $want in the loss" "$D/big.txt" || fail "the summary does not count the mask ($want): $(grep sft: "$D/big.txt")"
# an existing mask is refused without --overwrite
rm "$D/out/pc.bin" "$D/out/pc.idx"
if "$MEGATRAIN" data build --format sft --input "$D/pc.jsonl" --output "$D/out/pc" 2> "$D/err.txt"; then
  fail "an existing mask was replaced"; fi
grep -q "pc_mask.bin and .*pc_mask.idx already exist" "$D/err.txt" || fail "existing mask: $(cat "$D/err.txt")"

# --- real tokenizers: the same ids as the whole rendered text ----------------
# TOKENIZER TEMPLATE EOD: the SFT ids equal a plain build of each rendered
# document (as a JSONL text) without its end-of-document id; the template's
# special tokens are single ids; the counted ids are the assistant's.
check_tokenizer() {
  local fix=$1 template=$2 dir=${3:-$FIX/$1}
  "$MEGATRAIN" data build --format sft --chat-template "$template" --tokenizer "$dir/tokenizer.json" \
    --input "$D/chat.jsonl" --output "$D/out/${fix}_sft" > /dev/null || fail "$fix: sft build failed"
  python3 - "$D/out/$template" "$D/$fix.rendered.jsonl" <<'PY'
import json, struct, sys
idx = open(sys.argv[1] + ".idx", "rb").read()
n = struct.unpack_from("<Q", idx, 18)[0]
lengths = struct.unpack_from("<%di" % n, idx, 34)
data, at = open(sys.argv[1] + ".bin", "rb").read(), 0
with open(sys.argv[2], "w") as f:
    for l in lengths:
        text = bytes(struct.unpack_from("<%dH" % l, data, 2 * at)).decode(); at += l
        f.write(json.dumps({"text": text}) + "\n")
PY
  "$MEGATRAIN" data build --tokenizer "$dir/tokenizer.json" --input "$D/$fix.rendered.jsonl" \
    --output "$D/out/${fix}_plain" > /dev/null || fail "$fix: plain build failed"
  python3 - "$D/out/${fix}_sft" "$D/out/${fix}_plain" "$dir" <<'PY' || fail "$fix: sft ids differ from the whole text's"
import json, struct, sys
from idx_reader import read
sft, plain, masks = read(sys.argv[1], 2, "H"), read(sys.argv[2], 2, "H"), read(sys.argv[1] + "_mask", 1, "B")
added = {t["content"]: t["id"] for t in json.load(open(sys.argv[3] + "/tokenizer.json"))["added_tokens"]}
end = added["<|eot_id|>"] if "<|eot_id|>" in added else added["<|im_end|>"]
for s, p, m in zip(sft, plain, masks):
    assert s == p[:-1], (s, p)
    # every counted run ends with the end-of-turn id; every end-of-turn of an assistant turn is counted
    runs, cur = [], []
    for t, k in zip(s, m):
        if k: cur.append(t)
        elif cur: runs.append(cur); cur = []
    if cur: runs.append(cur)
    assert runs and all(r[-1] == end and end not in r[:-1] for r in runs), runs
    assert s.count(end) > len(runs)  # user / system turns end masked
    if "<think>" in added:  # qwen3: the empty think blocks are single ids, masked
        think = [i for i, t in enumerate(s) if t in (added["<think>"], added["</think>"])]
        assert think and not any(m[i] for i in think), (s, m)
PY
}
# Qwen3's tokenizer: Qwen2.5's with <think> and </think> added (non-special, as in Qwen/Qwen3-*)
mkdir -p "$D/qwen3"
python3 - "$FIX/qwen2/tokenizer.json" "$D/qwen3/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
next_id = max(a["id"] for a in t["added_tokens"]) + 1
for i, text in enumerate(["<think>", "</think>"]):
    t["added_tokens"].append({"id": next_id + i, "content": text, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": False})
json.dump(t, open(sys.argv[2], "w"))
PY
(cd "$REPO" && check_tokenizer llama3 llama3 && check_tokenizer qwen2 chatml && check_tokenizer qwen3 qwen3 "$D/qwen3" &&
  check_tokenizer llama31 llama3.1 "$FIX/llama3")

# --- bad input -----------------------------------------------------------------
# expect_error EXIT PATTERN LINE...: a build of these JSONL lines fails with EXIT and PATTERN.
expect_error() {
  local code=$1 pattern=$2; shift 2
  printf '%s\n' "$@" > "$D/bad.jsonl"
  local rc=0
  "$MEGATRAIN" data build --format sft --chat-template llama3 --input "$D/bad.jsonl" --output "$D/out/bad" \
    2> "$D/err.txt" > /dev/null || rc=$?
  [[ $rc -eq $code ]] || fail "'$pattern': exit $rc, expected $code: $(cat "$D/err.txt")"
  grep -q -- "$pattern" "$D/err.txt" || fail "expected '$pattern', got: $(cat "$D/err.txt")"
  [[ ! -e "$D/out/bad.idx" && ! -e "$D/out/bad_mask.idx" ]] || fail "'$pattern': a dataset was written"
}
ok='{"prompt": "a", "completion": "b"}'
# ShareGPT records (conversations of from/value, roles human and gpt) are not read: the errors say how to rewrite them
expect_error 1 'bad.jsonl:1: no "prompt" or "messages" field (expected {"prompt", "completion"} or {"messages": \[{"role", "content"}...\]}); ShareGPT'"'"'s "conversations" of {"from", "value"} are not read: rewrite them as "messages" of {"role", "content"}, human as user and gpt as assistant' \
  '{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}'
expect_error 1 'bad.jsonl:1: messages\[0\]: unknown role "human" (expected system, user or assistant; ShareGPT'"'"'s human and gpt: rewrite them as user and assistant)' \
  '{"messages": [{"role": "human", "content": "a"}, {"role": "gpt", "content": "b"}]}'
expect_error 1 'bad.jsonl:2: no "completion" field' "$ok" '{"prompt": "a"}'
expect_error 1 'bad.jsonl:3: messages\[1\]: unknown role "tool" (expected system, user or assistant)' "$ok" "$ok" \
  '{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}'
expect_error 1 'bad.jsonl:1: no assistant message' '{"messages": [{"role": "user", "content": "a"}]}'
expect_error 1 'bad.jsonl:1: messages\[0\]: no "content" field' '{"messages": [{"role": "user"}]}'
expect_error 1 'bad.jsonl:1: "completion" is a number (expected a string)' '{"prompt": "a", "completion": 3}'
expect_error 1 'bad.jsonl:1: no "prompt" or "messages" field' '{"text": "a"}'
expect_error 1 'bad.jsonl:2: "system" is a number (expected a string)' "$ok" '{"system": 3, "prompt": "a", "completion": "b"}'
# TRL's conversational prompt-completion: lists of messages on both sides, the system message inside the prompt
conv_prompt='"prompt": [{"role": "user", "content": "a"}]'
expect_error 1 'bad.jsonl:1: "completion" is a string (expected a non-empty array of {"role", "content"})' \
  "{$conv_prompt, \"completion\": \"b\"}"
expect_error 1 'bad.jsonl:1: no assistant message in "completion" (nothing to train on)' \
  "{$conv_prompt, \"completion\": [{\"role\": \"user\", \"content\": \"b\"}]}"
expect_error 1 'bad.jsonl:1: "system" beside a conversational "prompt"' \
  "{\"system\": \"s\", $conv_prompt, \"completion\": [{\"role\": \"assistant\", \"content\": \"b\"}]}"
expect_error 1 'bad.jsonl:1: completion\[0\]: unknown role "tool"' \
  "{$conv_prompt, \"completion\": [{\"role\": \"tool\", \"content\": \"b\"}]}"
expect_error 1 'bad.jsonl:1: both "messages" and "prompt" (expected one form' \
  '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "prompt": "a", "completion": "b"}'
expect_error 1 'bad.jsonl:2: bad JSON: column 17: ' "$ok" '{"prompt": "a", '
# a file that is one JSON array of records (as many datasets ship) is named as such, with the way to JSON Lines
expect_error 1 "bad.jsonl:1: bad JSON: column 2: .*(the line opens a JSON array: data build reads JSON Lines, one object a \
line; \`jq -c '.\[\]' FILE.json > FILE.jsonl\` writes a list of records so)" '[' "$ok" ']'
# a role with a NUL inside is shown whole, as JSON writes it (the message used to stop at the NUL: "user")
expect_error 1 'bad.jsonl:1: messages\[0\]: unknown role "user\\u0000x"' \
  '{"messages": [{"role": "user\u0000x", "content": "a"}, {"role": "assistant", "content": "b"}]}'
# an eos_token in tokenizer_config.json that is no token's text (a number) is said, not passed over in silence
mkdir -p "$D/eos5" && cp "$FIX/qwen2/tokenizer.json" "$D/eos5/" && echo '{"eos_token": 5}' > "$D/eos5/tokenizer_config.json"
printf 'hello\n' > "$D/eos5.txt"
"$MEGATRAIN" data build --input "$D/eos5.txt" --output "$D/out/eos5" --tokenizer "$D/eos5" > /dev/null 2> "$D/err.txt" || true
grep -qF "eos5/tokenizer_config.json: eos_token is not a string, not a token's text: not used" "$D/err.txt" ||
  fail "eos_token 5: $(cat "$D/err.txt")"
# --json-key names a JSONL field; SFT records have their own (it was taken and ignored)
rc=0; "$MEGATRAIN" data build --format sft --chat-template llama3 --json-key foo --input "$D/bad.jsonl" \
  --output "$D/out/key" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -qF -- '--json-key has no use with --format sft' "$D/err.txt" || fail "--json-key with sft: $rc"
printf '%s\n' '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' > "$D/m.jsonl"
rc=0; "$MEGATRAIN" data build --format sft --input "$D/m.jsonl" --output "$D/out/m" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -q 'm.jsonl:1: a "messages" record needs a chat template (--chat-template auto, the model'"'"'s own read beside --tokenizer, or one of llama3' "$D/err.txt" ||
  fail "messages without a template: $rc $(cat "$D/err.txt")"
# a prompt/completion record's "system" is its system message (it was dropped without a word), and needs a template
printf '%s\n' '{"system": "Be brief.", "prompt": "a", "completion": "b"}' > "$D/sys.jsonl"
"$MEGATRAIN" data build --format sft --chat-template llama3 --input "$D/sys.jsonl" --output "$D/out/sys" > /dev/null
tr -d '\000' < "$D/out/sys.bin" > "$D/sys.txt" # byte ids, 2 bytes each
grep -qF '<|start_header_id|>system<|end_header_id|>' "$D/sys.txt" && grep -qF 'Be brief.' "$D/sys.txt" ||
  fail "the system field was not rendered: $(cat "$D/sys.txt")"
rc=0; "$MEGATRAIN" data build --format sft --input "$D/sys.jsonl" --output "$D/out/sys0" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -q 'sys.jsonl:1: a "system" field needs a chat template' "$D/err.txt" ||
  fail "system without a template: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --format sft --chat-template llama2 --input "$D/m.jsonl" --output "$D/out/m" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- '--chat-template llama2: no such template (expected auto or one of: llama3, llama3.1, chatml, qwen3)' "$D/err.txt" ||
  fail "unknown template: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --chat-template llama3 --input "$D/m.jsonl" --output "$D/out/m" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- '--chat-template needs --format sft' "$D/err.txt" || fail "template without sft: $rc"
rc=0; "$MEGATRAIN" data build --format sft --chat-template --input "$D/m.jsonl" --output "$D/out/m" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -qF -- '--chat-template needs a value (found the option --input after it)' "$D/err.txt" ||
  fail "a template name missing: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --format chat --input "$D/m.jsonl" --output "$D/out/m" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- '--format chat: unknown format' "$D/err.txt" || fail "unknown format: $rc"
# chat records built without --format sft (read as JSONL text, which has no "text" field) are told to use it
rc=0; "$MEGATRAIN" data build --input "$D/m.jsonl" --output "$D/out/m" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -qF 'm.jsonl:1: the JSON object has no "text" field (--json-key picks the field): it is a chat record ("messages"): build fine-tuning data with --format sft --chat-template auto --tokenizer MODEL_DIR' "$D/err.txt" ||
  fail "messages without --format sft: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --input "$D/pc.jsonl" --output "$D/out/pc-text" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -qF 'pc.jsonl:1: the JSON object has no "text" field (--json-key picks the field): it is a prompt/completion record: build fine-tuning data with --format sft' "$D/err.txt" ||
  fail "prompt/completion without --format sft: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --input "$D/sys.jsonl" --output "$D/out/body" --json-key body 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -qF 'sys.jsonl:1: the JSON object has no "body" field (--json-key picks the field): it is a prompt/completion record' "$D/err.txt" ||
  fail "prompt/completion with --json-key: $rc $(cat "$D/err.txt")"
printf '{"content": "a"}\n' > "$D/plain.jsonl"
rc=0; "$MEGATRAIN" data build --input "$D/plain.jsonl" --output "$D/out/plain" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -qF 'plain.jsonl:1: the JSON object has no "text" field (--json-key picks the field)' "$D/err.txt" &&
  ! grep -q 'format sft' "$D/err.txt" || fail "a plain record without text: $rc $(cat "$D/err.txt")"
# a template whose special tokens the tokenizer lacks (Llama 3's on Qwen's, ChatML on Llama 3's) is refused before
# anything is written: its tokens would be stored as ordinary text pieces
for spec in "llama3|qwen2|<|begin_of_text|>" "chatml|llama3|<|im_start|>" "qwen3|qwen2|<think>"; do
  IFS='|' read -r template fix token <<< "$spec"
  rc=0; "$MEGATRAIN" data build --format sft --chat-template "$template" --tokenizer "$FIX/$fix" --input "$D/chat.jsonl" \
    --output "$D/out/wrong_$template" 2> "$D/err.txt" || rc=$?
  [[ $rc -eq 2 ]] && grep -qF -- "--chat-template $template: $FIX/$fix/tokenizer.json has no token $token (it would become" \
    "$D/err.txt" || fail "$template on $fix: $rc $(cat "$D/err.txt")"
  [[ ! -e "$D/out/wrong_$template.idx" ]] || fail "$template on $fix: a dataset was written"
done
# --chat-template auto takes the model's own template (chat_template.jinja, or tokenizer_config.json's
# chat_template) when it is one of ours; a template named that is not the model's own is said (chatml for a Qwen3:
# the data would not be what it sees at inference)
TPL="$REPO/tests/fixtures/chat_templates/templates"
cp "$TPL/qwen3.jinja" "$D/qwen3/chat_template.jinja"
"$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$D/qwen3" --input "$D/chat.jsonl" \
  --output "$D/out/auto" > "$D/auto.log" 2>&1 || fail "auto: $(cat "$D/auto.log")"
grep -q "data build: --chat-template auto: qwen3, from $D/qwen3/chat_template.jinja" "$D/auto.log" &&
  grep -q "chat template qwen3" "$D/auto.log" || fail "auto: $(cat "$D/auto.log")"
"$MEGATRAIN" data build --format sft --chat-template chatml --tokenizer "$D/qwen3" --input "$D/chat.jsonl" \
  --output "$D/out/mismatch" > "$D/mismatch.log" 2>&1 || fail "chatml on the Qwen3 model: $(cat "$D/mismatch.log")"
grep -qF "warning: data build: --chat-template chatml, but the model's own template ($D/qwen3/chat_template.jinja) is qwen3's" \
  "$D/mismatch.log" || fail "chatml on the Qwen3 model: no warning: $(cat "$D/mismatch.log")"
[[ ! -s "$D/auto.log" ]] || ! grep -q "writes text the published template does not" "$D/auto.log" ||
  fail "auto: the published Qwen3 template drew a warning: $(cat "$D/auto.log")"
# ours by its marks, with a default system prompt of its own (a fine-tune's): built as ours, with a warning naming
# the text the data will not hold
mkdir -p "$D/pirate" && cp "$FIX/llama3/tokenizer.json" "$D/pirate/"
{ printf '%s' "{%- if messages[0]['role'] != 'system' %}{{- '<|start_header_id|>system<|end_header_id|>\n\nYou are a \
pirate.<|eot_id|>' }}{%- endif %}"; cat "$TPL/llama3.jinja"; } > "$D/pirate/chat_template.jinja"
"$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$D/pirate" --input "$D/chat.jsonl" \
  --output "$D/out/pirate" > "$D/pirate.log" 2>&1 || fail "auto with a default system prompt: $(cat "$D/pirate.log")"
grep -qF "warning: data build: the model's chat template ($D/pirate/chat_template.jinja) is llama3's by its marks, but \
writes text the published template does not (1 piece, the first: \"system You are a pirate.\"): megatrain renders the \
published llama3 template, without it" "$D/pirate.log" || fail "auto with a default system prompt: $(cat "$D/pirate.log")"
# a template that is none of ours: refused, naming the file
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%}' > "$D/llama31-other.jinja"
mkdir -p "$D/other" && cp "$FIX/llama3/tokenizer.json" "$D/other/" && cp "$D/llama31-other.jinja" "$D/other/chat_template.jinja"
rc=0; "$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$D/other" --input "$D/chat.jsonl" \
  --output "$D/out/auto-other" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -qF -- "--chat-template auto: the model's chat template ($D/other/chat_template.jinja) is none of those \
megatrain renders (llama3, llama3.1, chatml, qwen3), and arbitrary Jinja templates are not evaluated: render each \
conversation with it yourself into a prompt/completion record" "$D/err.txt" || fail "auto with another template: $rc $(cat "$D/err.txt")"
# tokenizer_config.json's chat_template (a named list, its default), Llama 3.1's: auto finds it there
mkdir -p "$D/llama31" && cp "$FIX/llama3/tokenizer.json" "$D/llama31/"
python3 -c 'import json, sys; json.dump({"chat_template": [{"name": "tool_use", "template": "x"},
  {"name": "default", "template": open(sys.argv[1]).read()}]}, open(sys.argv[2], "w"))' \
  "$TPL/llama3.1.jinja" "$D/llama31/tokenizer_config.json"
"$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$D/llama31" --input "$D/chat.jsonl" \
  --output "$D/out/auto31" > "$D/auto31.log" 2>&1 && grep -q "auto: llama3.1, from .*tokenizer_config.json" "$D/auto31.log" ||
  fail "auto from tokenizer_config.json: $(cat "$D/auto31.log")"
# a named list without a "default": said so, with its names (it said there was no template at all)
mkdir -p "$D/named" && cp "$FIX/llama3/tokenizer.json" "$D/named/"
printf '%s' '{"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "rag", "template": "y"}]}' \
  > "$D/named/tokenizer_config.json"
rc=0; "$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$D/named" --input "$D/chat.jsonl" \
  --output "$D/out/auto-named" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- "has named chat templates (tool_use, rag) but none named \"default\"" "$D/err.txt" ||
  fail "auto with named templates and no default: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --format sft --chat-template auto --tokenizer "$FIX/qwen2" --input "$D/chat.jsonl" \
  --output "$D/out/auto-none" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--chat-template auto: no chat template beside the tokenizer in $FIX/qwen2 (chat_template.jinja" "$D/err.txt" ||
  fail "auto without a template: $rc $(cat "$D/err.txt")"
rc=0; "$MEGATRAIN" data build --format sft --chat-template auto --input "$D/chat.jsonl" --output "$D/out/auto-byte" \
  2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--chat-template auto reads the model's template beside --tokenizer PATH" "$D/err.txt" ||
  fail "auto with the byte tokenizer: $rc $(cat "$D/err.txt")"
# a template appends no end-of-document token (its turns end with its own), so --eod-token is refused with one,
# and the summary says there is none
rc=0; "$MEGATRAIN" data build --format sft --chat-template chatml --tokenizer "$FIX/qwen2" --eod-token '<|endoftext|>' \
  --input "$D/chat.jsonl" --output "$D/out/eod" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -qF -- "--eod-token has no use with --chat-template" "$D/err.txt" ||
  fail "--eod-token with a template: $rc $(cat "$D/err.txt")"
"$MEGATRAIN" data build --format sft --chat-template chatml --tokenizer "$FIX/qwen2" --input "$D/chat.jsonl" \
  --output "$D/out/eod" > "$D/log.txt" || fail "chatml on qwen2 failed"
grep -qF "no end of document: the template ends turns)" "$D/log.txt" || fail "summary: $(cat "$D/log.txt")"
# data inspect --json says so too: no end-of-document id to count (it gave the tokenizer's, ending 0 documents)
"$MEGATRAIN" data inspect "$D/out/eod" --tokenizer "$FIX/qwen2" --json > "$D/inspect-eod.json"
grep -qF '"end_of_document_id":null,"documents_ending_with_it":null,' "$D/inspect-eod.json" &&
  grep -qF '"end_of_document_note":"none appended (its build record says so' "$D/inspect-eod.json" ||
  fail "inspect --json of a template's build: $(cat "$D/inspect-eod.json")"
# a field that is null is absent (columnar exports write null for a column a row lacks): the same documents as
# the records without them (before: '"system" is null', and messages null beside a prompt was "both")
printf '%s\n' '{"system": null, "prompt": "Hi", "completion": "Hello"}' \
  '{"prompt": "Hi", "completion": "Hello", "messages": null}' \
  '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "prompt": null, "completion": null}' \
  > "$D/nulls.jsonl"
printf '%s\n' '{"prompt": "Hi", "completion": "Hello"}' '{"prompt": "Hi", "completion": "Hello"}' \
  '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}' > "$D/no-nulls.jsonl"
for f in nulls no-nulls; do
  "$MEGATRAIN" data build --format sft --chat-template chatml --input "$D/$f.jsonl" --output "$D/out/$f" > /dev/null ||
    fail "$f: build failed"
done
cmp -s "$D/out/nulls.bin" "$D/out/no-nulls.bin" && cmp -s "$D/out/nulls_mask.bin" "$D/out/no-nulls_mask.bin" ||
  fail "null fields: other documents than without them"

# --overwrite puts tokens and mask in place as one unit: a rebuild whose tokens fail at the end (their fsync finds
# the disk full: tests/integration/fail_fsync.c) leaves the old dataset whole, its mask and build record too
# (before, the new mask was already in place beside the old tokens, and the record gone); a fresh build failing so
# leaves nothing
cc -shared -fPIC -o "$D/fail_fsync.so" "$REPO/tests/integration/fail_fsync.c" -ldl || fail "cannot build fail_fsync.so"
failing_fsync() { # MATCH CMD...: CMD with every fsync of a path containing MATCH failing (sanitizers let it load)
  local match=$1; shift
  LD_PRELOAD="$D/fail_fsync.so" FAIL_FSYNC_MATCH="$match" \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" "$@"
}
python3 - "$D/big_a.jsonl" "$D/big_b.jsonl" <<'PY'
import json, random, sys
random.seed(5)
words = ["alpha", "beta", "gamma", "delta"]
with open(sys.argv[1], "w") as a, open(sys.argv[2], "w") as b:
    for i in range(200):
        say = lambda: " ".join(random.choice(words) for _ in range(12))
        turns = [{"role": r, "content": say()} for r in ("user", "assistant", "user", "assistant")]
        a.write(json.dumps({"messages": turns}) + "\n")
        upper = [dict(t, content=t["content"].upper()) for t in turns]  # the same lengths, another mask
        b.write(json.dumps({"prompt": upper[:3], "completion": upper[3:]}) + "\n")
PY
"$MEGATRAIN" data build --format sft --chat-template llama3 --input "$D/big_a.jsonl" --output "$D/out/pair" > /dev/null \
  || fail "pair: first build"
for f in pair.bin pair.idx pair_mask.bin pair_mask.idx pair.build.json; do cp "$D/out/$f" "$D/out/$f.orig"; done
for file in .bin.tmp .idx.tmp _mask.bin.tmp _mask.idx.tmp; do
  match=pair$file
  rc=0; failing_fsync "$match" "$MEGATRAIN" data build --format sft --chat-template llama3 --input "$D/big_b.jsonl" \
    --output "$D/out/pair" --overwrite > /dev/null 2> "$D/err.txt" || rc=$?
  [[ $rc -eq 1 ]] && grep -q "$match.*: write failed: No space left on device" "$D/err.txt" ||
    fail "pair, $match failing: $rc $(cat "$D/err.txt")"
  for f in pair.bin pair.idx pair_mask.bin pair_mask.idx pair.build.json; do
    cmp -s "$D/out/$f" "$D/out/$f.orig" || fail "pair: a failed --overwrite ($match) changed $f"
  done
  [[ -z $(find "$D/out" -name 'pair*.tmp.*') ]] || fail "pair: temporary files left: $(ls "$D/out")"
  rc=0; failing_fsync "fresh$file" "$MEGATRAIN" data build --format sft --chat-template llama3 \
    --input "$D/big_b.jsonl" --output "$D/out/fresh" > /dev/null 2> "$D/err.txt" || rc=$?
  [[ $rc -eq 1 && -z $(find "$D/out" -name 'fresh*') ]] ||
    fail "fresh build, fresh$file failing: $rc, left $(find "$D/out" -name 'fresh*')"
done
# a pretraining build beside a loss mask (an SFT prefix's, or one left alone): refused without --overwrite (the mask
# would apply to it), and with it the old mask goes
printf 'plain text\n' > "$D/plain.txt"
cp "$D/out/pair_mask.bin" "$D/out/lone_mask.bin"; cp "$D/out/pair_mask.idx" "$D/out/lone_mask.idx"
rc=0; "$MEGATRAIN" data build --input "$D/plain.txt" --output "$D/out/lone" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q "lone_mask.bin and .*lone_mask.idx already exist, a loss mask without its dataset (left by a build killed as it finished?); pass --overwrite" "$D/err.txt" ||
  fail "text beside a mask: $rc $(cat "$D/err.txt")"
"$MEGATRAIN" data build --input "$D/plain.txt" --output "$D/out/pair" --overwrite > "$D/log.txt" ||
  fail "text over an SFT prefix with --overwrite"
grep -q "removed .*pair_mask.{bin,idx}, the loss mask of the dataset replaced" "$D/log.txt" &&
  [[ ! -e "$D/out/pair_mask.bin" && ! -e "$D/out/pair_mask.idx" && -e "$D/out/pair.idx" ]] ||
  fail "text over an SFT prefix: the old mask stayed: $(ls "$D/out" | grep pair)"
# empty assistant replies (content "" or whitespace only) train only their end of turn: counted, and a warning at the
# end names how many records and the first one's line, across batches and workers (a reply with qwen3 reasoning is
# not empty: the reasoning is trained); none for records with replies
python3 - "$D/empty.jsonl" <<'PY'
import json, sys
say = lambda c: {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": c}]}
with open(sys.argv[1], "w") as f:
    for i in range(1, 30001):  # about 2.4 MB: several batches
        if i == 12345: f.write(json.dumps(say("")) + "\n")
        elif i == 20000: f.write(json.dumps(say(" \n\t")) + "\n")
        elif i == 25000: f.write(json.dumps({"prompt": "q", "completion": ""}) + "\n")
        elif i == 26000:
            f.write(json.dumps({"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "", "reasoning_content": "hm"}]}) + "\n")
        else: f.write(json.dumps(say("fine %d" % i)) + "\n")
PY
for template in chatml qwen3; do
  "$MEGATRAIN" data build --format sft --chat-template $template --workers 3 --input "$D/empty.jsonl" \
    --output "$D/out/empty" --overwrite > /dev/null 2> "$D/err.txt" || fail "empty replies, $template: the build failed"
  n=3; [[ $template == chatml ]] && n=4 # the reply with only reasoning_content is empty without qwen3
  grep -qF "warning: data build: $n records of $D/empty.jsonl hold an empty assistant reply (content \"\" or whitespace \
only; the first: $D/empty.jsonl:12345): only its end-of-turn token is trained" "$D/err.txt" ||
    fail "empty replies, $template: $(cat "$D/err.txt")"
done
printf '%s\n' '{"prompt": "q", "completion": ""}' > "$D/empty1.jsonl"
"$MEGATRAIN" data build --format sft --input "$D/empty1.jsonl" --output "$D/out/empty1" > /dev/null 2> "$D/err.txt"
grep -qF "1 record of $D/empty1.jsonl holds an empty assistant reply (content \"\" or whitespace only; the first: \
$D/empty1.jsonl:1): only its end-of-document token is trained" "$D/err.txt" || fail "an empty completion: $(cat "$D/err.txt")"
"$MEGATRAIN" data build --format sft --chat-template llama3 --input "$D/chat.jsonl" --output "$D/out/nonempty" \
  > /dev/null 2> "$D/err.txt" && ! grep -q "empty assistant reply" "$D/err.txt" || fail "replies: $(cat "$D/err.txt")"
# (to a file first: grep -q on a pipe may exit before the writer ends, and pipefail would see its SIGPIPE)
"$MEGATRAIN" data build --help > "$WORK/help.txt" || fail "--help failed"
grep -q -- "--chat-template NAME" "$WORK/help.txt" || fail "--help lacks --chat-template"
echo "PASS test_data_build_sft"
