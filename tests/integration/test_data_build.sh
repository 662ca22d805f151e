#!/usr/bin/env bash
# test_data_build.sh: `megatrain data build` turns plain text and JSONL into a
# Megatron .bin/.idx pair with byte tokens (uint16, '\n' = 10 ending each
# document), and its errors exit non-zero, name the file and line, and leave
# no files behind (nor touch a good dataset already there). An existing
# prefix is refused without --overwrite; a build stopped or killed midway
# never leaves a PREFIX.idx.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
D="$WORK"

# u16 FILE: the .bin as unsigned 16-bit numbers, one per line.
u16() { od -An -v -tu2 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
# u8 FILE: bytes as numbers, one per line.
u8() { od -An -v -tu1 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
# le_u64 FILE OFFSET: an unsigned 64-bit little-endian field.
le_u64() { od -An -tu8 -j "$2" -N 8 "$1" | tr -d ' '; }
size() { stat -c %s "$1"; }
# only_files DIR NAME...: DIR holds exactly these names.
only_files() { local dir=$1; shift; [[ "$(ls -A "$dir" | sort | tr '\n' ' ')" == "$( (($#)) && printf '%s\n' "$@" | sort | tr '\n' ' ')" ]]; }

# --- plain text: every non-blank line is a document --------------------------
printf 'hello world\n\n   \nsecond line\nna\xc3\xafve caf\xc3\xa9\nlast line without newline' > "$D/plain.txt"
"$MEGATRAIN" data build --input "$D/plain.txt" --output "$D/out/plain" > "$D/log.txt"
grep -q "documents: 4" "$D/log.txt" || fail "summary does not say 4 documents: $(cat "$D/log.txt")"
docs=4
# expected tokens: the bytes of the non-blank lines, each followed by 10
grep -v '^[[:space:]]*$' "$D/plain.txt" > "$D/plain.expected"   # grep ends every line with \n
bytes=$(size "$D/plain.expected")
[[ $(size "$D/out/plain.bin") -eq $((2 * bytes)) ]] || fail "plain.bin is $(size "$D/out/plain.bin") bytes, expected $((2 * bytes))"
diff <(u16 "$D/out/plain.bin") <(u8 "$D/plain.expected") > /dev/null || fail "plain.bin tokens differ from the input bytes"
[[ $(size "$D/out/plain.idx") -eq $((34 + 12 * docs + 8 * (docs + 1))) ]] || fail "plain.idx size $(size "$D/out/plain.idx")"
[[ "$(head -c 9 "$D/out/plain.idx" | od -An -c | tr -d ' ')" == 'MMIDIDX\0\0' ]] || fail "bad magic"
[[ $(le_u64 "$D/out/plain.idx" 9) -eq 1 ]] || fail "version is not 1"
[[ $(od -An -tu1 -j 17 -N 1 "$D/out/plain.idx" | tr -d ' ') -eq 8 ]] || fail "dtype code is not 8 (uint16)"
[[ $(le_u64 "$D/out/plain.idx" 18) -eq $docs ]] || fail "sequence count is not $docs"
[[ $(le_u64 "$D/out/plain.idx" 26) -eq $((docs + 1)) ]] || fail "document count is not documents + 1"
only_files "$D/out" plain.bin plain.idx plain.build.json || fail "unexpected files in out/: $(ls "$D/out")"
grep -q '"kind": "byte"' "$D/out/plain.build.json" && grep -qx "  \"tokens\": $bytes" "$D/out/plain.build.json" ||
  fail "plain.build.json does not record the byte tokenizer and $bytes tokens: $(cat "$D/out/plain.build.json")"

# --- JSONL with escapes, nested values and another field order ---------------
cat > "$D/docs.jsonl" <<'EOF'
{"text": "a\"b\\c\nd\u00e9\ud83d\ude00/\/", "id": 1, "meta": {"tags": [1, 2.5e3, -0.5, null, true, false, {"k": "v"}]}}

{"id": 2, "text": "plain"}
  {"text": ""}
EOF
"$MEGATRAIN" data build --input "$D/docs.jsonl" --output "$D/out/json" > "$D/log.txt"
grep -q "documents: 2" "$D/log.txt" || fail "jsonl summary: $(cat "$D/log.txt")"
printf 'a"b\\c\nd\xc3\xa9\xf0\x9f\x98\x80//\nplain\n' > "$D/json.expected"
diff <(u16 "$D/out/json.bin") <(u8 "$D/json.expected") > /dev/null || fail "json.bin tokens differ: $(u16 "$D/out/json.bin" | tr '\n' ' ')"

# JSONL detected by its first '{' whatever the file name; --json-key picks the field
printf '{"body": "xy", "text": 3}\n{"body": "z"}\n' > "$D/body.txt"
"$MEGATRAIN" data build --input "$D/body.txt" --output "$D/out/body" --json-key body --tokenizer byte > /dev/null
diff <(u16 "$D/out/body.bin") <(printf 'xy\nz\n' | od -An -v -tu1 | tr -s ' ' '\n' | sed '/^$/d') > /dev/null ||
  fail "--json-key body: wrong tokens"

# --format text | jsonl: the file's format whatever its name and first line say (a text corpus whose first line
# starts with '{', JSON lines in a .txt file)
printf '{not json: one line of text}\nsecond\n' > "$D/curly.txt"
"$MEGATRAIN" data build --input "$D/curly.txt" --output "$D/formats/curly" --format text > /dev/null ||
  fail "--format text: a text file starting with '{' was not built as text"
diff <(u16 "$D/formats/curly.bin") <(od -An -v -tu1 "$D/curly.txt" | tr -s ' ' '\n' | sed '/^$/d') > /dev/null ||
  fail "--format text: wrong tokens"
"$MEGATRAIN" data build --input "$D/body.txt" --output "$D/formats/body" --json-key body --format jsonl > /dev/null
cmp -s "$D/out/body.bin" "$D/formats/body.bin" || fail "--format jsonl: not the JSONL build"

# --- errors -------------------------------------------------------------------
expect_fail() { # expect_fail STATUS PATTERN ARGS...: exit STATUS (or any non-zero for '!'), stderr matches
  local want=$1 pattern=$2; shift 2
  set +e; "$MEGATRAIN" data build "$@" > "$D/out.txt" 2> "$D/err.txt"; local rc=$?; set -e
  if [[ $want == '!' ]]; then [[ $rc -ne 0 ]] || fail "data build $* succeeded"
  else [[ $rc -eq $want ]] || fail "data build $*: exit $rc, expected $want"; fi
  grep -q -- "$pattern" "$D/err.txt" || fail "data build $*: stderr lacks '$pattern': $(cat "$D/err.txt")"
}
mkdir -p "$D/bad"
expect_fail '!' "nothing.txt" --input "$D/nothing.txt" --output "$D/bad/x"
printf '{"text": "ok"}\n{"text": "unterminated}\n' > "$D/broken.jsonl"
expect_fail '!' "broken.jsonl:2" --input "$D/broken.jsonl" --output "$D/bad/x"
printf '{"text": "a\0b"}\n' > "$D/nul.jsonl"  # a raw NUL is named by value (printed, it would end the message)
expect_fail '!' "nul.jsonl:1: bad JSON: column 12: expected no raw control character inside a string (use an escape), found byte 0x00$" \
  --input "$D/nul.jsonl" --output "$D/bad/x"
printf '{"text": "ok"}\n{"text": "x"} trailing\n' > "$D/trailing.jsonl"
expect_fail '!' "trailing.jsonl:2" --input "$D/trailing.jsonl" --output "$D/bad/x"
printf '{"text": "ok"}\n\n{"title": "no text"}\n' > "$D/notext.jsonl"
expect_fail '!' 'notext.jsonl:3.*"text"' --input "$D/notext.jsonl" --output "$D/bad/x"
printf '{"text": ["a"]}\n' > "$D/array.jsonl"
expect_fail '!' "not a string" --input "$D/array.jsonl" --output "$D/bad/x"
printf '\n  \n' > "$D/blank.txt"
expect_fail '!' "no documents" --input "$D/blank.txt" --output "$D/bad/x"
expect_fail 2 "tokenizer.json: No such file" --input "$D/plain.txt" --output "$D/bad/x" --tokenizer "$D/tokenizer.json"
expect_fail 2 "--output" --input "$D/plain.txt"
expect_fail 2 "unknown option '--vocab'" --input "$D/plain.txt" --output "$D/bad/x" --vocab 5
# Megatron's preprocess_data.py's flags and several inputs: what to give instead
expect_fail 2 "unknown option '--output-prefix' (Megatron's preprocess_data.py's; here: --output PREFIX)" \
  --input "$D/plain.txt" --output-prefix "$D/bad/x"
expect_fail 2 "unexpected argument '$D/trailing.jsonl': --input takes one file" --input "$D/plain.txt" \
  "$D/trailing.jsonl" --output "$D/bad/x"
expect_fail 2 "format csv: unknown format (expected text, jsonl or sft" --input "$D/plain.txt" --output "$D/bad/x" \
  --format csv
expect_fail 2 "--chat-template needs --format sft" --input "$D/plain.txt" --output "$D/bad/x" --format text \
  --chat-template llama3
only_files "$D/bad" || fail "failed builds left files behind: $(ls -A "$D/bad")"

# --- a directory as the prefix (it would write DIR/.bin): refused -
for out in / "$D/out/" "$D/out/."; do
  expect_fail 2 "--output $out: expected a file prefix such as data/corpus" --input "$D/docs.jsonl" --output "$out"
done
# --- an existing prefix: refused (exit 2, naming the files) unless --overwrite -
for f in bin idx build.json; do cp "$D/out/plain.$f" "$D/plain.$f.before"; done
same_as_before() { for f in bin idx build.json; do cmp -s "$D/out/plain.$f" "$D/plain.$f.before" || return 1; done; }
expect_fail 2 "--output $D/out/plain: $D/out/plain.bin and $D/out/plain.idx already exist; pass --overwrite" \
  --input "$D/docs.jsonl" --output "$D/out/plain"
same_as_before || fail "a refused build changed the existing dataset"
cp "$D/out/body.bin" "$D/half.bin"  # a lone .bin is refused too
expect_fail 2 "$D/half.bin already exists; pass --overwrite to replace it" --input "$D/docs.jsonl" --output "$D/half"
# a failing --overwrite build leaves the dataset under the same prefix untouched
expect_fail '!' "broken.jsonl:2" --input "$D/broken.jsonl" --output "$D/out/plain" --overwrite
same_as_before || fail "a failed build changed the existing dataset"
only_files "$D/out" plain.{bin,idx,build.json} json.{bin,idx,build.json} body.{bin,idx,build.json} ||
  fail "leftovers in out/: $(ls -A "$D/out")"
# --overwrite replaces it (and removes the record's temporary file a killed build of this host left)
host=$(hostname | tr -c 'A-Za-z0-9\n-' '_')
touch "$D/out/plain.build.json.tmp.$host.999999999"
"$MEGATRAIN" data build --input "$D/docs.jsonl" --output "$D/out/plain" --overwrite > /dev/null
cmp -s "$D/out/plain.bin" "$D/out/json.bin" && cmp -s "$D/out/plain.idx" "$D/out/json.idx" &&
  cmp -s "$D/out/plain.build.json" "$D/out/json.build.json" || fail "--overwrite did not replace the dataset and its record"
only_files "$D/out" plain.{bin,idx,build.json} json.{bin,idx,build.json} body.{bin,idx,build.json} ||
  fail "leftovers in out/: $(ls -A "$D/out")"

# --- a build stopped midway (reading a FIFO that stays open) -------------------
# SIGTERM: its temporary files removed, nothing under the prefix; SIGKILL: no
# PREFIX.bin nor PREFIX.idx (only its PREFIX.bin.tmp.PID), and with
# --overwrite the old dataset intact.
mkfifo "$D/fifo"
mkdir -p "$D/kill"
# The bytes written to the FIFO that no one has read yet (FIONREAD on this shell's end, fd 3).
fifo_unread() { python3 -c 'import fcntl, struct, termios; print(struct.unpack("i", fcntl.ioctl(3, termios.FIONREAD, bytes(4)))[0])'; }
start_build() { # start_build PREFIX [ARGS...]: sets pid once the build writes its temporary .bin and has read both
  # lines (the FIFO drained and its main thread, the reader, asleep waiting for more), whatever its speed
  "$MEGATRAIN" data build --input "$D/fifo" --output "$1" "${@:2}" > /dev/null 2> "$D/kill.err" &
  pid=$!
  exec 3> "$D/fifo"
  printf 'first document\nsecond document\n' >&3
  for _ in $(seq 1 600); do
    compgen -G "$1.bin.tmp.*" > /dev/null && [[ $(fifo_unread) == 0 && $(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1) == S ]] &&
      return 0
    sleep 0.05
  done
  fail "the build into $1 did not start: $(cat "$D/kill.err")"
}
stop_build() { kill -"$1" "$pid"; status=0; { wait "$pid" || status=$?; } 2> /dev/null; exec 3>&-; }
start_build "$D/kill/term"
stop_build TERM
[[ $status -eq 143 ]] || fail "SIGTERM: exit status $status, expected 143 (killed by SIGTERM after cleaning up)"
grep -q "stopped by SIGTERM at line 2 of $D/fifo; nothing written under $D/kill/term" "$D/kill.err" ||
  fail "SIGTERM: no message: $(cat "$D/kill.err")"
only_files "$D/kill" || fail "SIGTERM left files: $(ls -A "$D/kill")"
start_build "$D/kill/x"
stop_build KILL
[[ ! -e "$D/kill/x.idx" && ! -e "$D/kill/x.bin" ]] || fail "SIGKILL left a dataset that looks complete: $(ls -A "$D/kill")"
compgen -G "$D/kill/x.bin.tmp.*" > /dev/null || fail "SIGKILL: the build was not midway (no temporary .bin)"
killed=$(compgen -G "$D/kill/x.bin.tmp.*")
[[ $killed == "$D/kill/x.bin.tmp.$(hostname | tr -c 'A-Za-z0-9\n-' '_').$pid" ]] ||
  fail "SIGKILL: the temporary file is not named PREFIX.bin.tmp.HOST.PID: $killed"
# a live build's file (this shell's pid) and another host's are not a killed build's: they stay
touch "$D/kill/x.bin.tmp.$(hostname | tr -c 'A-Za-z0-9\n-' '_').$$" "$D/kill/x.idx.tmp.otherhost.$pid"
"$MEGATRAIN" data build --input "$D/plain.txt" --output "$D/kill/x" > "$D/kill.out" ||
  fail "a build after a killed one into the same prefix failed"
[[ ! -e $killed ]] || fail "the build after a killed one left its temporary file $killed"
grep -q "removed 1 temporary file(s) of an earlier build that was killed ($killed)" "$D/kill.out" ||
  fail "no log line for the removed temporary file: $(cat "$D/kill.out")"
[[ -e "$D/kill/x.bin.tmp.$(hostname | tr -c 'A-Za-z0-9\n-' '_').$$" && -e "$D/kill/x.idx.tmp.otherhost.$pid" ]] ||
  fail "a live process's or another host's temporary file was removed"
rm -f "$D/kill/x.bin.tmp.$(hostname | tr -c 'A-Za-z0-9\n-' '_').$$" "$D/kill/x.idx.tmp.otherhost.$pid"
cp "$D/kill/x.bin" "$D/x.bin.before"; cp "$D/kill/x.idx" "$D/x.idx.before"
start_build "$D/kill/x" --overwrite
stop_build KILL
cmp -s "$D/kill/x.bin" "$D/x.bin.before" && cmp -s "$D/kill/x.idx" "$D/x.idx.before" ||
  fail "an --overwrite build killed midway changed the old dataset"

# a UTF-8 byte-order mark at the start is skipped, said in the summary: JSONL stays JSONL (it hid the first '{' and
# the lines became text documents of JSON syntax), and text loses no character to it
printf '\xef\xbb\xbf{"text": "hello"}\n{"text": "world"}\n' > "$D/bom.ndjson"
"$MEGATRAIN" data build --input "$D/bom.ndjson" --output "$D/bom" > "$D/bom.log" || fail "BOM: build failed"
"$MEGATRAIN" data inspect "$D/bom" --docs 1 >> "$D/bom.log"
grep -q "bom.ndjson (jsonl; its UTF-8 byte-order mark skipped)" "$D/bom.log" && grep -q '\[0\] 6 tokens: "hello\\n"' "$D/bom.log" ||
  fail "BOM JSONL: $(cat "$D/bom.log")"
printf '\xef\xbb\xbfhello\n' > "$D/bom.txt"
"$MEGATRAIN" data build --input "$D/bom.txt" --output "$D/bomt" > "$D/bom.log" || fail "BOM text: build failed"
"$MEGATRAIN" data inspect "$D/bomt" --docs 1 >> "$D/bom.log"
grep -q '\[0\] 6 tokens: "hello\\n"' "$D/bom.log" || fail "BOM text: $(cat "$D/bom.log")"

# NaN, Infinity and -Infinity in other fields (Python's json.dumps writes them) are read as json.loads reads them;
# 'NaNx' is still an error
printf '{"text": "hello", "score": NaN, "range": [-Infinity, Infinity]}\n' > "$D/nan.jsonl"
"$MEGATRAIN" data build --input "$D/nan.jsonl" --output "$D/nan" > /dev/null || fail "NaN in a JSONL field: refused"
printf '{"text": "hello", "score": NaNx}\n' > "$D/nanx.jsonl"
rc=0; "$MEGATRAIN" data build --input "$D/nanx.jsonl" --output "$D/nanx" 2> "$D/err.txt" || rc=$?
[[ $rc -eq 1 ]] && grep -q "nanx.jsonl:1: bad JSON" "$D/err.txt" || fail "NaNx: $rc $(cat "$D/err.txt")"

# an .idx of a smaller dataset beside a bigger .bin: inspect says what the .bin holds past the last document
printf 'aaaa\nbbbb\ncccc\n' > "$D/big.txt"; printf 'aa\n' > "$D/small.txt"
"$MEGATRAIN" data build --input "$D/big.txt" --output "$D/big" > /dev/null
"$MEGATRAIN" data build --input "$D/small.txt" --output "$D/small" > /dev/null
"$MEGATRAIN" data inspect "$D/big" > "$D/big.txt.out"
! grep -q "unindexed" "$D/big.txt.out" || fail "a whole dataset said to have unindexed bytes"
cp "$D/small.idx" "$D/big.idx"
"$MEGATRAIN" data inspect "$D/big" > "$D/big.txt.out"
grep -q "unindexed: the .bin holds 24 bytes after the last document" "$D/big.txt.out" ||
  fail "an .idx of a smaller dataset: not said: $(cat "$D/big.txt.out")"
"$MEGATRAIN" data inspect "$D/big" --json > "$D/big.json"
grep -q '"unindexed_bytes":24,' "$D/big.json" || fail "inspect --json: $(cat "$D/big.json")"

# an input that is one of the outputs (a text file named PREFIX.bin, with --overwrite) is refused, not replaced
mkdir -p "$D/self"; printf 'corpus text\n' > "$D/self/corpus.bin"; cp "$D/self/corpus.bin" "$D/self/before"
rc=0; "$MEGATRAIN" data build --input "$D/self/corpus.bin" --output "$D/self/corpus" --overwrite 2> "$D/err.txt" || rc=$?
[[ $rc -eq 2 ]] && grep -q "input .*corpus.bin is .*corpus.bin, one of the files this build writes" "$D/err.txt" &&
  cmp -s "$D/self/corpus.bin" "$D/self/before" || fail "input = output: $rc $(cat "$D/err.txt")"

# (to a file first: grep -q on a pipe may exit before the writer ends, and pipefail would see its SIGPIPE)
"$MEGATRAIN" data build --help > "$WORK/help.txt" || fail "--help failed"
grep -q -- "--input FILE" "$WORK/help.txt" || fail "--help does not print usage"
grep -q -- "--overwrite  *replace an existing PREFIX.bin" "$WORK/help.txt" || fail "--help does not list --overwrite"
echo "data build: ok"
