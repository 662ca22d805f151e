#!/usr/bin/env bash
# test_data_inspect.sh: `megatrain data inspect PREFIX [--tokenizer PATH]
# [--docs N] [--show-mask] [--json]` says what a dataset holds: documents, tokens, dtype,
# the id range against the vocabulary, documents ending with the
# end-of-document token, document lengths (min / mean / median / p95 / max,
# nearest rank: checked on 100 documents of known lengths), and the first
# documents' ids and text decoded (the fixtures' ids and texts of
# tests/fixtures/tokenizers, in text and JSON), and which tokenizer built it
# (PREFIX.build.json: --tokenizer's or not, none, unreadable; without --tokenizer its vocabulary and
# end-of-document id, the documents' ids undecoded); --show-mask marks the
# spans an SFT dataset's loss mask counts. A missing or corrupt dataset
# is an error naming the file and what is wrong. Under mpirun and srun rank 0 alone
# answers; a Slurm batch script's own call (no srun) is one process and says nothing of ranks.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
D="$WORK"
FIX="$REPO/tests/fixtures/tokenizers"

# --- 100 documents of 2..101 byte tokens, in a shuffled order ------------------
awk 'BEGIN { for (k = 0; k < 100; k++) { i = (k * 37) % 100 + 1; s = ""; for (j = 0; j < i; j++) s = s "x"; print s } }' \
  > "$D/lengths.txt"
"$MEGATRAIN" data build --input "$D/lengths.txt" --output "$D/lengths" > /dev/null
"$MEGATRAIN" data inspect "$D/lengths" --docs 1 > "$D/out.txt"
expect() { grep -qF -- "$1" "$D/out.txt" || fail "inspect output lacks '$1': $(cat "$D/out.txt")"; }
expect "data inspect: $D/lengths.{bin,idx}"
expect "documents: 100"
expect "tokens:    5150 (uint16, 2 bytes each; .bin 10300 bytes)"
expect "ids:       10 .. 120; byte tokenizer, vocabulary 256: every id inside it"
expect "end of document (id 10) ends 100 of 100 documents"
# sorted lengths 2..101: median (lower) the 50th = 51, p95 the 95th = 96
expect "document tokens: min 2, mean 51.5, median 51, p95 96, max 101"
expect "first 1 document, decoded with the byte tokenizer:"
expect '[0] 2 tokens: "x\n"'
"$MEGATRAIN" data inspect "$D/lengths" --json --docs 2 > "$D/out.txt"
# launched on 2 ranks, rank 0 alone answers, and stdout is still the one JSON object (the line saying so is on stderr)
if command -v mpirun > /dev/null; then
  timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" data inspect "$D/lengths" --json --docs 2 \
    > "$D/mpi.txt" 2> "$D/mpi.err" || fail "data inspect under mpirun: $(cat "$D/mpi.err")"
  cmp -s "$D/out.txt" "$D/mpi.txt" || fail "data inspect --json under mpirun printed other output: $(head -c 300 "$D/mpi.txt")"
  grep -q "rank 0 does the work" "$D/mpi.err" || fail "data inspect under mpirun: no line on stderr"
fi
# Slurm: a batch script's own call (SLURM_NTASKS of the allocation, no srun step) is one process and says nothing of
# ranks; a task of an srun step other than the first leaves at once (no MPI needed: the launcher's variables)
SLURM_NTASKS=4 SLURM_PROCID=0 "$MEGATRAIN" data inspect "$D/lengths" --json --docs 2 > "$D/slurm.txt" 2> "$D/slurm.err" &&
  cmp -s "$D/out.txt" "$D/slurm.txt" && [[ ! -s "$D/slurm.err" ]] || fail "a Slurm batch script's call: $(cat "$D/slurm.err")"
SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=0 "$MEGATRAIN" data inspect "$D/lengths" --json --docs 2 \
  > "$D/slurm.txt" 2> "$D/slurm.err" && cmp -s "$D/out.txt" "$D/slurm.txt" &&
  grep -q "this launch has 4 ranks (SLURM_NTASKS): rank 0 does the work" "$D/slurm.err" || fail "srun's task 0: $(cat "$D/slurm.err")"
SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=2 "$MEGATRAIN" data inspect "$D/lengths" --json --docs 2 \
  > "$D/slurm.txt" 2> "$D/slurm.err" && [[ ! -s "$D/slurm.txt" && ! -s "$D/slurm.err" ]] || fail "srun's task 2 answered"
expect '"documents":100,"sequences":100,"tokens":5150,"bin_bytes":10300,"unindexed_bytes":0,"min_id":10,"max_id":120,"tokenizer":"byte","vocab_size":256,"ids_inside_vocab":true,"end_of_document_id":10,"documents_ending_with_it":100,"document_tokens":{"min":2,"mean":51.5,"median":51,"p95":96,"max":101}'
expect '"first_documents":[{"index":0,"tokens":2,"ids":[120,10],"text":"x\n"},{"index":1,"tokens":39,"ids":[120,'
expect '"build_record":{"tokenizer":"byte","vocab_size":256,"same_as_tokenizer_option":null}}'

# --- chat-template data: no end-of-document token, as its build record says; without the record, the count ------
"$MEGATRAIN" data build --format sft --chat-template llama3 --input "$REPO/recipes/sft/chat.jsonl" --output "$D/chat" \
  > /dev/null
"$MEGATRAIN" data inspect "$D/chat" --docs 0 > "$D/out.txt"
expect "end of document: none appended (its build record says so: a chat template ends each turn with its own"
# the loss mask itself, inspected: said to be the mask of the tokens beside it, not tokens
"$MEGATRAIN" data inspect "$D/chat_mask" --docs 0 > "$D/out.txt"
expect "this is the loss mask of $D/chat (1 where a token counts in the loss), not tokens; give $D/chat as data"
"$MEGATRAIN" data inspect "$D/chat_mask" --docs 0 --json > "$D/out.txt"
expect "\"loss_mask_of\":\"$D/chat\""
# --show-mask: the spans the loss mask counts marked [[ ]] in the decoded documents (byte tokenizer and Llama 3's)
printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you."}]}' > "$D/two.jsonl"
for tokenizer in byte llama3; do
  opts=(); [[ $tokenizer == llama3 ]] && opts=(--tokenizer "$FIX/llama3")
  "$MEGATRAIN" data build --format sft --chat-template llama3 "${opts[@]}" --input "$D/two.jsonl" --output "$D/two-$tokenizer" > /dev/null
  "$MEGATRAIN" data inspect "$D/two-$tokenizer" "${opts[@]}" --docs 1 --show-mask > "$D/out.txt"
  expect '[0] '
  expect '"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[[Hello!<|eot_id|>]]<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[[See you.<|eot_id|>]]"'
  expect "masked); counted spans in [[ ]] below"
  "$MEGATRAIN" data inspect "$D/two-$tokenizer" "${opts[@]}" --docs 1 > "$D/out.txt"
  expect "masked); --show-mask marks them in the documents"
  ! grep -qF '[[' "$D/out.txt" || fail "$tokenizer: spans marked without --show-mask: $(cat "$D/out.txt")"
done
# each span shows the text its tokens have in the document's decode: the marks taken out, the document's text. A span
# decoded alone lost the leading space SentencePiece's decoders drop from the first token decoded (Metaspace's
# prepend_scheme, Llama 2's Strip): "[[the answer" of " the answer", "[[ the" of "  the"; ByteLevel's keep it.
printf '%s\n' '{"prompt": "What is the answer", "completion": " the answer is here"}' \
  '{"prompt": "Café au lait? ", "completion": "Oui, très bien ☃."}' '{"prompt": "Say it twice:", "completion": "  twice  "}' \
  > "$D/spaced.jsonl"
for tokenizer in llama2 llama3 qwen2 metaspace; do
  "$MEGATRAIN" data build --format sft --tokenizer "$FIX/$tokenizer" --input "$D/spaced.jsonl" --output "$D/spaced-$tokenizer" \
    > /dev/null
  "$MEGATRAIN" data inspect "$D/spaced-$tokenizer" --tokenizer "$FIX/$tokenizer" --docs 3 --show-mask > "$D/out.txt"
  "$MEGATRAIN" data inspect "$D/spaced-$tokenizer" --tokenizer "$FIX/$tokenizer" --docs 3 > "$D/plain.txt"
  [[ $(grep -c '^  \[[0-9].*\[\[' "$D/out.txt") -eq 3 ]] || fail "$tokenizer: not 3 marked documents: $(cat "$D/out.txt")"
  diff <(grep '^  \[[0-9]' "$D/out.txt" | sed 's/\[\[//g; s/\]\]//g') <(grep '^  \[[0-9]' "$D/plain.txt") > /dev/null ||
    fail "$tokenizer: --show-mask's spans are not the document's text: $(diff <(grep '^  \[[0-9]' "$D/out.txt") \
      <(grep '^  \[[0-9]' "$D/plain.txt"))"
done
expect '[0] 17 tokens: "What is the answer[[ the answer is here</s>]]"' # (metaspace, the last of the loop)
"$MEGATRAIN" data inspect "$D/spaced-llama2" --tokenizer "$FIX/llama2" --docs 1 --show-mask > "$D/out.txt"
expect '[0] 18 tokens: "What is the answer[[  the answer is here</s>]]"'
"$MEGATRAIN" data inspect "$D/lengths" --docs 1 --show-mask > "$D/out.txt"
expect "loss mask: none (--show-mask: every token counts)"
expect '[0] 2 tokens: "x\n"'
rm "$D/chat.build.json"
"$MEGATRAIN" data inspect "$D/chat" --docs 0 > "$D/out.txt"
expect "end of document (id 10) ends 0 of 20 documents"

# --- tokenizer.json datasets: the fixtures' ids, decoded ----------------------
# case_field FIXTURE NAME hex|ids
case_field() {
  grep -o "{\"name\":\"$2\",\"hex\":\"[0-9a-f]*\",\"ids\":\[[0-9,]*\]" "$FIX/$1/expected.json" |
    sed -E "s/.*\"hex\":\"([0-9a-f]*)\",\"ids\":\[([0-9,]*)\].*/\\$([[ $3 == hex ]] && echo 1 || echo 2)/"
}
unhex() { printf '%b' "$(sed 's/../\\x&/g' <<< "$1")"; }
for c in ascii cjk emoji; do unhex "$(case_field llama3 "$c" hex)"; echo; done > "$D/llama3.txt"
printf '{"text": "def f(x):\\n    return x * 2  # double\\n\\tpass\\n"}\n' >> "$D/llama3.jsonl"
"$MEGATRAIN" data build --input "$D/llama3.txt" --output "$D/l3" --tokenizer "$FIX/llama3" > /dev/null
"$MEGATRAIN" data build --input "$D/llama3.jsonl" --output "$D/l3code" --tokenizer "$FIX/llama3" > /dev/null
eod=$(grep -o '"id":[0-9]*,"content":"<|end_of_text|>"' "$FIX/llama3/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/')
vocab=$(( $(grep -o '"id":[0-9]*,"content":"<|python_tag|>"' "$FIX/llama3/tokenizer.json" | sed -E 's/"id":([0-9]*).*/\1/') + 1 ))
"$MEGATRAIN" data inspect "$D/l3" --tokenizer "$FIX/llama3" --json > "$D/out.txt"
expect "\"tokenizer\":\"$FIX/llama3/tokenizer.json\",\"vocab_size\":$vocab,\"ids_inside_vocab\":true,\"end_of_document_id\":$eod,\"documents_ending_with_it\":3"
for k in 0 1 2; do
  c=$(sed -n "$((k + 1))p" <<< $'ascii\ncjk\nemoji')
  ids=$(case_field llama3 "$c" ids)
  text=$(sed -n "$((k + 1))p" "$D/llama3.txt")
  expect "{\"index\":$k,\"tokens\":$(( $(tr ',' '\n' <<< "$ids" | wc -l) + 1 )),\"ids\":[$ids,$eod],\"text\":\"$text<|end_of_text|>\"}"
done
"$MEGATRAIN" data inspect "$D/l3code" --tokenizer "$FIX/llama3" --json > "$D/out.txt"
expect "\"ids\":[$(case_field llama3 code ids),$eod],\"text\":\"def f(x):\\n    return x * 2  # double\\n\\tpass\\n<|end_of_text|>\"}"
"$MEGATRAIN" data inspect "$D/l3code" --tokenizer "$FIX/llama3" > "$D/out.txt"
expect "built by:  megatrain data build with a tokenizer.json of $(stat -c %s "$FIX/llama3/tokenizer.json") bytes (CRC-32C "
expect ", vocabulary $vocab): --tokenizer's"
"$MEGATRAIN" data inspect "$D/l3code" --tokenizer "$FIX/qwen2" --docs 0 > "$D/out.txt"
expect "vocabulary $vocab): NOT --tokenizer's"
# without --tokenizer, the build record's vocabulary and end-of-document id: no "ids outside", the eod counted, the
# documents' ids shown undecoded (the byte tokenizer would make a healthy dataset look broken)
"$MEGATRAIN" data inspect "$D/l3code" --docs 1 > "$D/out.txt"
expect "the recorded tokenizer.json's vocabulary $vocab: every id inside it"
expect "end of document (id $eod) ends "
expect "(not decoded: --tokenizer with the tokenizer.json that built it decodes them):"
expect "[0] $(( $(tr ',' '\n' <<< "$(case_field llama3 code ids)" | wc -l) + 1 )) tokens: ids $(case_field llama3 code ids | tr ',' ' ') $eod"
# ... unless the record is stale (the files replaced since: a byte dataset under the old record): the byte tokenizer
mkdir -p "$D/stale" && cp "$D/l3code.build.json" "$D/stale/x.build.json" && cp "$D/lengths.bin" "$D/stale/x.bin" &&
  cp "$D/lengths.idx" "$D/stale/x.idx"
"$MEGATRAIN" data inspect "$D/stale/x" --docs 1 > "$D/out.txt"
expect "byte tokenizer, vocabulary 256: every id inside it"
expect "(STALE: it counts other documents or tokens than the files hold, which were replaced since; not used)"
expect '[0] 2 tokens: "x\n"'
mv "$D/l3code.build.json" "$D/l3code.record"
"$MEGATRAIN" data inspect "$D/l3code" --docs 0 > "$D/out.txt"
expect "built by:  unknown (no $D/l3code.build.json: not made by megatrain data build"
printf '{"built_by": "megatrain data build"}' > "$D/l3code.build.json"
"$MEGATRAIN" data inspect "$D/l3code" --docs 0 > "$D/out.txt"
expect "built by:  unreadable record: $D/l3code.build.json: expected an object with"
mv "$D/l3code.record" "$D/l3code.build.json"
"$MEGATRAIN" data inspect "$D/l3code" --tokenizer "$FIX/llama3" > "$D/out.txt"
expect "  [0] $(( $(case_field llama3 code ids | tr ',' '\n' | wc -l) + 1 )) tokens: \"def f(x):\\n    return x * 2  # double\\n\\tpass\\n<|end_of_text|>\""
expect "uint16, 2 bytes each"
# read with the byte tokenizer (no --tokenizer, no build record), the same ids are not bytes
mv "$D/l3.build.json" "$D/l3.record"
"$MEGATRAIN" data inspect "$D/l3" --docs 1 > "$D/out.txt"
expect "SOME IDS OUTSIDE IT (another tokenizer?)"
expect "<id:$eod>"
mv "$D/l3.record" "$D/l3.build.json"
# --docs 0: the summary only
"$MEGATRAIN" data inspect "$D/l3" --tokenizer "$FIX/llama3" --docs 0 > "$D/out.txt"
! grep -q "first " "$D/out.txt" || fail "--docs 0 shows documents: $(cat "$D/out.txt")"

# a decoder megatrain does not implement: no text, the reason instead (exit 0)
sed 's/"decoder":{[^}]*}/"decoder":{"type":"WordPiece","prefix":"##","cleanup":true}/' "$FIX/llama3/tokenizer.json" \
  > "$D/wordpiece.json"
grep -q '"WordPiece"' "$D/wordpiece.json" || fail "could not plant a WordPiece decoder"
"$MEGATRAIN" data inspect "$D/l3" --tokenizer "$D/wordpiece.json" --docs 1 > "$D/out.txt"
expect "(not decoded: $D/wordpiece.json: decoder: decoder \"WordPiece\" is not supported"
"$MEGATRAIN" data inspect "$D/l3" --tokenizer "$D/wordpiece.json" --docs 1 --json > "$D/out.txt"
expect '"text":null'

# --- missing and corrupt datasets --------------------------------------------------
expect_fail() { # STATUS PATTERN ARGS...
  local want=$1 pattern=$2; shift 2
  set +e; "$MEGATRAIN" data inspect "$@" > "$D/out.txt" 2> "$D/err.txt"; local rc=$?; set -e
  [[ $rc -eq $want ]] || fail "data inspect $*: exit $rc, expected $want: $(cat "$D/err.txt")"
  grep -qF -- "$pattern" "$D/err.txt" || fail "data inspect $*: stderr lacks '$pattern': $(cat "$D/err.txt")"
}
expect_fail 2 "$D/nothing.idx: cannot open: No such file or directory" "$D/nothing"
cp "$D/lengths.bin" "$D/short.bin"; head -c 20 "$D/lengths.idx" > "$D/short.idx"
expect_fail 1 "$D/short.idx: truncated index: 20 bytes, the header alone needs 34" "$D/short"
cp "$D/lengths.bin" "$D/magic.bin"; { printf 'NOTANIDX\0'; tail -c +10 "$D/lengths.idx"; } > "$D/magic.idx"
expect_fail 1 "$D/magic.idx: not a Megatron indexed dataset (bad magic" "$D/magic"
cp "$D/lengths.idx" "$D/cut.idx"; head -c 1000 "$D/lengths.bin" > "$D/cut.bin"
expect_fail 1 "$D/cut.bin: sequence" "$D/cut"
grep -qF "lies outside the file (1000 bytes); truncated or mismatched with $D/cut.idx" "$D/err.txt" || fail "cut: $(cat "$D/err.txt")"
cp "$D/lengths.idx" "$D/nobin.idx"
expect_fail 1 "$D/nobin.bin: cannot open: No such file or directory" "$D/nobin"
# bytes after the document index (a Megatron multimodal dataset's mode byte a sequence): read, with a warning
cp "$D/lengths.bin" "$D/modes.bin"; { cat "$D/lengths.idx"; head -c 100 /dev/zero; } > "$D/modes.idx"
"$MEGATRAIN" data inspect "$D/modes" > "$D/out.txt" 2> "$D/err.txt" || fail "modes: $(cat "$D/err.txt")"
grep -qF "warning: $D/modes.idx: 100 bytes after the document index (one a sequence: a Megatron multimodal dataset's sequence modes); megatrain reads the tokens as text" "$D/err.txt" &&
  grep -qF "documents: 100" "$D/out.txt" || fail "modes: $(cat "$D/err.txt" "$D/out.txt")"
expect_fail 2 "PREFIX is required"
expect_fail 2 "--docs -1: expected a whole number" "$D/lengths" --docs -1
expect_fail 2 "unknown option '--colour'" "$D/lengths" --colour
expect_fail 2 "one PREFIX only" "$D/lengths" "$D/l3"
expect_fail 2 "--tokenizer: $D/missing" "$D/lengths" --tokenizer "$D/missing"

"$MEGATRAIN" data --help > "$D/out.txt"
expect "megatrain data build --input FILE"
expect "megatrain data inspect PREFIX [--tokenizer PATH] [--docs N] [--json]"
"$MEGATRAIN" data inspect --help > "$D/help.txt" # (not grep -q on a pipe: SIGPIPE)
grep -q -- "--docs N" "$D/help.txt" || fail "data inspect --help"
set +e; "$MEGATRAIN" data nonsense > /dev/null 2> "$D/err.txt"; rc=$?; set -e
[[ $rc -eq 2 ]] && grep -q "expected 'build' or 'inspect'" "$D/err.txt" || fail "data nonsense: exit $rc: $(cat "$D/err.txt")"
echo "data inspect: ok"

# --- a document index that ends before the last sequence (Megatron's builder ends it at the count) -----------
printf 'hello world\nfoo bar baz\nthird doc here\n' > "$D/three.txt"
"$MEGATRAIN" data build --input "$D/three.txt" --output "$D/short_docs" > /dev/null
for kept in 2 0; do # the index's count of document entries (documents + 1) at offset 26, cut to kept + 1
  python3 -c "import struct,sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); struct.pack_into('<Q', b, 26, $kept + 1); open(p,'wb').write(b)" "$D/short_docs.idx"
  "$MEGATRAIN" data inspect "$D/short_docs" > "$D/out.txt" 2> "$D/err.txt"
  grep -qF "short_docs.idx: the document index ends at sequence $kept of 3: the last $((3 - kept)) sequences belong to no document and are not used" "$D/err.txt" ||
    fail "a short document index ($kept): no warning: $(cat "$D/err.txt")"
done
expect "ids:       none (no tokens)"
echo "a document index that ends early: warned of, the sequences past it named"
