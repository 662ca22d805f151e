#!/usr/bin/env bash
# test_data_build_tokenizer.sh: `megatrain data build --tokenizer PATH` writes
# the ids Hugging Face `tokenizers` gives (tests/fixtures/tokenizers/*/expected.json,
# made by make_fixtures.py) followed by the tokenizer's end-of-document id:
# uint16 for the small Llama 3 and Llama 2 fixtures, int32 for a Qwen2
# tokenizer with 70006 ids, whose dataset then trains with `megatrain run`
# and which `data inspect` reads as int32. Bad tokenizers (a WordPiece or
# Unigram model, no merges list, a file cut short) and --eod-token misuse are
# refused (exit 2) naming the file and the key, or the line and column.
# --add-bos puts the post-processor's beginning-of-sequence token before each
# document (Llama 3's), and is refused for a tokenizer that has none (Qwen2).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
D="$WORK"
FIX="$REPO/tests/fixtures/tokenizers"

# case_field FIXTURE NAME FIELD: "hex" or "ids" (comma-separated) of a case of expected.json.
case_field() {
  grep -o "{\"name\":\"$2\",\"hex\":\"[0-9a-f]*\",\"ids\":\[[0-9,]*\]" "$FIX/$1/expected.json" |
    sed -E "s/.*\"hex\":\"([0-9a-f]*)\",\"ids\":\[([0-9,]*)\].*/\\$([[ $3 == hex ]] && echo 1 || echo 2)/"
}
unhex() { printf '%b' "$(sed 's/../\\x&/g' <<< "$1")"; }
# tokens FILE BYTES: the .bin as unsigned numbers of BYTES bytes, one per line.
tokens() { od -An -v -tu"$2" "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
dtype_code() { od -An -tu1 -j 17 -N 1 "$1" | tr -d ' '; }

# Documents: cases without a newline (one per line of a text file), and one
# with newlines and tabs as a JSONL line.
CASES=(ascii "contractions lower" "contractions upper" digits accented "nfc combining" cjk emoji
       "mixed scripts" punctuation "special token after space")

check_text_build() { # FIXTURE EOD_ID BYTES DTYPE_CODE [TOKENIZER_PATH]
  local fixture=$1 eod=$2 bytes=$3 code=$4 path=${5:-$FIX/$1/tokenizer.json}
  : > "$D/$fixture.txt"; : > "$D/$fixture.expected"
  for c in "${CASES[@]}"; do
    local hex; hex=$(case_field "$fixture" "$c" hex)
    [[ -n "$hex" ]] || fail "$fixture: no case '$c' in expected.json"
    unhex "$hex" >> "$D/$fixture.txt"; echo >> "$D/$fixture.txt"
    { case_field "$fixture" "$c" ids | tr ',' '\n'; echo "$eod"; } >> "$D/$fixture.expected"
  done
  "$MEGATRAIN" data build --input "$D/$fixture.txt" --output "$D/out/$fixture" --tokenizer "$path" > "$D/log.txt" ||
    fail "$fixture: data build failed"
  grep -q "documents: ${#CASES[@]}" "$D/log.txt" || fail "$fixture: summary: $(cat "$D/log.txt")"
  [[ $(dtype_code "$D/out/$fixture.idx") -eq $code ]] || fail "$fixture: dtype code $(dtype_code "$D/out/$fixture.idx"), expected $code"
  diff <(tokens "$D/out/$fixture.bin" "$bytes") "$D/$fixture.expected" > "$D/diff.txt" ||
    fail "$fixture: tokens differ from tokenizers' ids: $(head -n 20 "$D/diff.txt")"
}

# --- Llama 3 (byte-level BPE, vocab 897): uint16, eod <|end_of_text|> ---------
eod=$(grep -o '"id":[0-9]*,"content":"<|end_of_text|>"' "$FIX/llama3/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/')
check_text_build llama3 "$eod" 2 8
grep -q "end of document = <|end_of_text|> = $eod" "$D/log.txt" || fail "llama3 summary lacks the eod: $(cat "$D/log.txt")"
# a model directory works as well as the file
"$MEGATRAIN" data build --input "$D/llama3.txt" --output "$D/out/llama3_dir" --tokenizer "$FIX/llama3" > /dev/null
cmp -s "$D/out/llama3.bin" "$D/out/llama3_dir.bin" || fail "the directory form gives other tokens"

# --add-bos: the post-processor's token before $A first (Llama 3's <|begin_of_text|>): transformers' ids with the
# special tokens, as Megatron's preprocess_data.py writes them with a Hugging Face tokenizer
bos=$(grep -o '"id":[0-9]*,"content":"<|begin_of_text|>"' "$FIX/llama3/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/')
"$MEGATRAIN" data build --input "$D/llama3.txt" --output "$D/out/llama3_bos" --tokenizer "$FIX/llama3" --add-bos \
  > "$D/log.txt" || fail "--add-bos: data build failed"
grep -q "begin of document = <|begin_of_text|> = $bos, end of document = <|end_of_text|> = $eod" "$D/log.txt" ||
  fail "--add-bos: the summary does not name the token: $(cat "$D/log.txt")"
# bos before every document: first, and after each eod but the last
awk -v bos="$bos" -v eod="$eod" 'NR == 1 { print bos } { print } $0 == eod { print bos }' "$D/llama3.expected" |
  sed '$d' > "$D/llama3_bos.expected"
diff <(tokens "$D/out/llama3_bos.bin" 2) "$D/llama3_bos.expected" > "$D/diff.txt" ||
  fail "--add-bos: tokens differ: $(head -n 20 "$D/diff.txt")"
status=0; "$MEGATRAIN" data build --input "$D/llama3.txt" --output "$D/out/qwen_bos" --tokenizer "$FIX/qwen2" \
  --add-bos > /dev/null 2> "$D/err.txt" || status=$?
[[ $status -eq 2 ]] && grep -q "post-processor puts no special token before a sequence" "$D/err.txt" ||
  fail "--add-bos with Qwen's tokenizer (no beginning-of-sequence token): $status $(cat "$D/err.txt")"
# --format sft without a chat template (prompt + completion as they are): the token before each prompt, masked, as
# transformers' tokenizer(prompt) and TRL give a base model; with a template (which writes its own) refused
printf '{"prompt": "What is 2 + 3?", "completion": " 5"}\n{"prompt": "Hi", "completion": " there"}\n' > "$D/pc.jsonl"
for bos_flag in "" --add-bos; do
  "$MEGATRAIN" data build --format sft --input "$D/pc.jsonl" --output "$D/out/pc$bos_flag" --tokenizer "$FIX/llama3" \
    ${bos_flag:+"$bos_flag"} > /dev/null || fail "sft $bos_flag: data build failed"
done
awk -v bos="$bos" -v eod="$eod" 'NR == 1 { print bos } { print } $0 == eod { print bos }' <(tokens "$D/out/pc.bin" 2) |
  sed '$d' > "$D/pc_bos.expected"
diff <(tokens "$D/out/pc--add-bos.bin" 2) "$D/pc_bos.expected" > "$D/diff.txt" ||
  fail "sft --add-bos: tokens differ: $(head -n 20 "$D/diff.txt")"
sum() { awk '{ s += $1 } END { print s + 0 }'; }
[[ "$(tokens "$D/out/pc--add-bos_mask.bin" 1 | head -n 1)" == 0 &&
   "$(tokens "$D/out/pc--add-bos_mask.bin" 1 | sum)" == "$(tokens "$D/out/pc_mask.bin" 1 | sum)" ]] ||
  fail "sft --add-bos: the token is not masked, or the counted tokens changed"
status=0; "$MEGATRAIN" data build --format sft --chat-template llama3 --input "$D/pc.jsonl" --output "$D/out/pc_t" \
  --tokenizer "$FIX/llama3" --add-bos > /dev/null 2> "$D/err.txt" || status=$?
[[ $status -eq 2 ]] && grep -q "add-bos has no use with --chat-template: a chat template writes its own" "$D/err.txt" ||
  fail "--add-bos with a chat template: $status $(cat "$D/err.txt")"

# --- Llama 2 (SentencePiece-style BPE with byte fallback): eod </s> = 2 -------
check_text_build llama2 2 2 8

# --- JSONL with escapes: the "code" case of the Qwen2 fixture ------------------
printf '{"text": "def f(x):\\n    return x * 2  # double\\n\\tpass\\n", "id": 7}\n' > "$D/code.jsonl"
unhex "$(case_field qwen2 code hex)" > "$D/code.raw"
printf 'def f(x):\n    return x * 2  # double\n\tpass\n' | cmp -s - "$D/code.raw" || fail "the JSONL line is not the code case"
"$MEGATRAIN" data build --input "$D/code.jsonl" --output "$D/out/code" --tokenizer "$FIX/qwen2/tokenizer.json" > /dev/null
eod=$(grep -o '"id":[0-9]*,"content":"<|endoftext|>"' "$FIX/qwen2/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/')
diff <(tokens "$D/out/code.bin" 2) <({ case_field qwen2 code ids | tr ',' '\n'; echo "$eod"; }) > /dev/null ||
  fail "qwen2 JSONL tokens differ"
# --eod-token picks another token
"$MEGATRAIN" data build --input "$D/code.jsonl" --output "$D/out/code_im" --tokenizer "$FIX/qwen2" \
  --eod-token '<|im_end|>' > /dev/null
im_end=$(grep -o '"id":[0-9]*,"content":"<|im_end|>"' "$FIX/qwen2/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/')
[[ $(tokens "$D/out/code_im.bin" 2 | tail -n 1) -eq $im_end ]] || fail "--eod-token '<|im_end|>' not appended"

# --- Qwen2 with 70006 ids: int32, and the dataset trains ----------------------
# qwen2_bigid is qwen2 with model.vocab padded by "<fN>" entries up to id 69999
# (make_fixtures.py's with_fillers); its added tokens get ids 70000..70005.
bigid_tokenizer "$D/big"
CASES=(ascii digits cjk emoji "special token after space" "special token only")
check_text_build qwen2_bigid 70000 4 4 "$D/big"
grep -q "vocab 70006" "$D/log.txt" || fail "big vocab summary: $(cat "$D/log.txt")"
tokens "$D/out/qwen2_bigid.bin" 4 | awk '$1 >= 65536 { big = 1 } END { exit !big }' || fail "no id above 65535 was written"
"$MEGATRAIN" data inspect "$D/out/qwen2_bigid" --tokenizer "$D/big" --docs 0 --json > "$D/inspect.json"
grep -q '"dtype":"int32",.*"max_id":70000,.*"vocab_size":70006,"ids_inside_vocab":true,"end_of_document_id":70000' \
  "$D/inspect.json" || fail "inspect of the int32 dataset: $(cat "$D/inspect.json")"
# enough tokens for a few steps of seq_len 16
for i in $(seq 40); do cat "$D/qwen2_bigid.txt"; done > "$D/big.txt"
"$MEGATRAIN" data build --input "$D/big.txt" --output "$D/out/big" --tokenizer "$D/big" > /dev/null
"$MEGATRAIN" run "$REPO/recipes/tiny/llama.yaml" --set run.dir="$D/run" --set model.vocab_size=70006 \
  --set model.hidden_size=16 --set model.intermediate_size=32 --set model.num_layers=1 \
  --set train.steps=2 --set optimizer.schedule.warmup_steps=0 --set train.seq_len=16 --set train.micro_batch_size=2 \
  --set "train.batch_schedule=[{step: 0, global_batch_size: 2}]" --set train.eval_interval=0 \
  --set "data.train=[{path: $D/out/big, weight: 1.0}]" --set logging.interval=1 > "$D/run.txt" 2>&1 ||
  fail "megatrain run on the int32 dataset failed: $(tail -n 5 "$D/run.txt")"
[[ $(json_field "$D/run/metrics.jsonl" loss | wc -l) -eq 2 ]] || fail "no loss for 2 steps: $(tail -n 5 "$D/run.txt")"
first=$(json_field "$D/run/metrics.jsonl" loss | head -n 1)
awk -v a="$first" 'BEGIN { exit !(a > 10.5 && a < 12.0) }' || fail "first loss $first is not near ln(70006)=11.16"

# --- refused ------------------------------------------------------------------
expect_fail() { # STATUS PATTERN ARGS...
  local want=$1 pattern=$2; shift 2
  set +e; "$MEGATRAIN" data build "$@" > "$D/out.txt" 2> "$D/err.txt"; local rc=$?; set -e
  [[ $rc -eq $want ]] || fail "data build $*: exit $rc, expected $want: $(cat "$D/err.txt")"
  grep -qF -- "$pattern" "$D/err.txt" || fail "data build $*: stderr lacks '$pattern': $(cat "$D/err.txt")"
}
mkdir -p "$D/bad"
printf '{"model": {"type": "WordPiece", "vocab": {}}}' > "$D/bad/unsupported.json"
expect_fail 2 "unsupported.json: model.type: \"WordPiece\" is not supported" \
  --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/bad/unsupported.json"
printf '{"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]}}' > "$D/bad/unigram.json"
expect_fail 2 "unigram.json: model.type: \"Unigram\" is not supported (only BPE)" \
  --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/bad/unigram.json"
# a tokenizer.json cut short (a download that stopped): the line and column where it ends
printf '{\n  "model": {\n    "type": "BPE",\n    "vocab": {"a": 0, "b": 1, "ab": 2},\n    "merges": ["a b",' \
  > "$D/bad/cut.json"
expect_fail 2 "cut.json: line 5, column 22: expected" --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/bad/cut.json"
head -c 5000 "$FIX/llama2/tokenizer.json" > "$D/bad/cut_fixture.json"
expect_fail 2 "cut_fixture.json: line 1, column 5001: expected ',' or '}' in an object, found the end of the text" \
  --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/bad/cut_fixture.json"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}}}' > "$D/bad/no_merges.json"
expect_fail 2 "no_merges.json: model.merges: expected an array" \
  --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/bad/no_merges.json"
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}' > "$D/bad/no_eod.json"
expect_fail 2 "name one with --eod-token" --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/bad/no_eod.json"
"$MEGATRAIN" data build --input "$D/code.jsonl" --output "$D/out/ab" --tokenizer "$D/bad/no_eod.json" --eod-token ab > /dev/null
expect_fail 2 "\"<nope>\"" --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$FIX/qwen2" --eod-token '<nope>'
expect_fail 2 "--eod-token needs --tokenizer PATH" --input "$D/code.jsonl" --output "$D/out/x" --eod-token x
expect_fail 2 "$D/missing" --input "$D/code.jsonl" --output "$D/out/x" --tokenizer "$D/missing"
[[ ! -e "$D/out/x.bin" && ! -e "$D/out/x.idx" ]] || fail "a refused build left files"
echo "ok"
