#!/usr/bin/env bash
# test_data_build_scale.sh: `megatrain data build` on inputs of any size.
# - The output is the same bytes for --workers 1, 2, 3 and 7 on an input of
#   many batches (text and JSONL, a real tokenizer and the byte one).
# - Memory stays bounded: a 1 GiB file without a line end, read under a 600 MB
#   address-space limit, stops with an error naming the file and line 1; a
#   huge JSONL line likewise (line 3); a line of exactly --max-line-mib passes
#   and one byte more does not.
# - A JSONL file that ends inside an object is an error naming the file and
#   the line and saying it looks truncated; with a bad line early and a too
#   long line later, the earlier one is reported whatever the workers.
# - SIGINT and SIGKILL in the middle of a large build: SIGINT removes the
#   temporary files (exit 130); SIGKILL leaves no PREFIX.bin nor PREFIX.idx,
#   and with --overwrite the old dataset intact.
# - Progress: a line redrawn on a terminal (documents, MB/s, tokens/s); a short
#   build whose stderr is not a terminal prints nothing there.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
D="$WORK"
FIX="$REPO/tests/fixtures/tokenizers"
size() { stat -c %s "$1"; }
only_files() { local dir=$1; shift; [[ "$(ls -A "$dir" | sort | tr '\n' ' ')" == "$( (($#)) && printf '%s\n' "$@" | sort | tr '\n' ' ')" ]]; }

# An input of about 6 MB (6 batches of 1 MiB): lines of different lengths and
# scripts, blank lines, and a few long ones.
awk 'BEGIN {
  split("the quick brown fox jumps over lazy dog café naïve 東京 我们 😀 12345 def f(x): return", w, " ");
  for (i = 0; i < 60000; i++) {
    n = (i * 7919) % 40 + 1; line = "";
    for (j = 0; j < n; j++) line = line w[(i + j * 31) % 18 + 1] " ";
    if (i % 997 == 0) for (k = 0; k < 200; k++) line = line "long" k " ";
    print line;
    if (i % 101 == 0) print "";
  } }' > "$D/many.txt"
[[ $(size "$D/many.txt") -gt $((5 * 1024 * 1024)) ]] || fail "the generated input is only $(size "$D/many.txt") bytes"
awk '{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "{\"id\": %d, \"text\": \"%s\"}\n", NR, $0 }' "$D/many.txt" |
  grep -v '"text": ""' > "$D/many.jsonl"

# --- the same bytes for any number of workers --------------------------------
inputs=(many.txt many.jsonl) workers=(1 2 3 7)
# under the sanitizers (test_host_threads_tsan.sh: ThreadSanitizer), the text input with 1, 3 and 7 workers: the same
# handoffs between reader, workers and writer in 6 builds rather than 16 (101 s of that script's time)
[[ ${MT_SANITIZE:-0} != 1 ]] || { inputs=(many.txt) workers=(1 3 7); }
for input in "${inputs[@]}"; do
  for tok in "$FIX/qwen2" byte; do
    tag=$(basename "$tok")
    for w in "${workers[@]}"; do
      "$MEGATRAIN" data build --input "$D/$input" --output "$D/w/$input.$tag.$w" --tokenizer "$tok" --workers "$w" \
        > "$D/log.txt" || fail "$input with $tag, --workers $w failed: $(cat "$D/log.txt")"
      grep -q "speed: .* MB/s read, .* M tokens/s, $w worker" "$D/log.txt" || fail "no speed line: $(cat "$D/log.txt")"
    done
    for w in "${workers[@]:1}"; do
      cmp -s "$D/w/$input.$tag.1.bin" "$D/w/$input.$tag.$w.bin" && cmp -s "$D/w/$input.$tag.1.idx" "$D/w/$input.$tag.$w.idx" ||
        fail "$input with $tag: --workers $w wrote other bytes than --workers 1"
    done
  done
done
docs=$(grep -c '[^[:space:]]' "$D/many.txt")
"$MEGATRAIN" data build --input "$D/many.txt" --output "$D/w/check" --workers 3 > "$D/log.txt"
grep -q "documents: $docs (skipped $(grep -c '^$' "$D/many.txt") blank lines" "$D/log.txt" ||
  fail "expected $docs documents: $(cat "$D/log.txt")"
# byte tokens: each document's bytes, then 10 (the non-blank lines of the input, in order)
cmp -s <(od -An -v -tu2 "$D/w/check.bin" | tr -s ' ' '\n' | sed '/^$/d') \
       <(grep '[^[:space:]]' "$D/many.txt" | od -An -v -tu1 | tr -s ' ' '\n' | sed '/^$/d') ||
  fail "the byte tokens of --workers 3 are not the input's lines in order"

# --- bounded memory: no line end, a huge line --------------------------------
expect_error() { # expect_error PATTERN ARGS...: data build exits 1, stderr has PATTERN, nothing left under $D/bad
  local pattern=$1; shift
  # The limit is on address space: glibc reserves 64 MiB per malloc arena, and how many arenas the worker threads
  # make depends on lock contention (a loaded machine made more, and a 2 MiB allocation failed once in make test);
  # two arenas keep the reserve fixed, so the limit measures what the build allocates.
  set +e; (limit_address_space 600000; MALLOC_ARENA_MAX=2 "$MEGATRAIN" data build "$@" > "$D/out.txt" 2> "$D/err.txt")
  local rc=$?; set -e
  [[ $rc -eq 1 ]] || fail "data build $*: exit $rc, expected 1: $(cat "$D/err.txt")"
  grep -qF -- "$pattern" "$D/err.txt" || fail "data build $*: stderr lacks '$pattern': $(cat "$D/err.txt")"
  only_files "$D/bad" || fail "data build $* left files: $(ls -A "$D/bad")"
}
mkdir -p "$D/bad"
truncate -s 1G "$D/no_line_end.txt"   # sparse: 1 GiB of NUL bytes, no '\n'
expect_error "$D/no_line_end.txt:1: line longer than 67108864 bytes (--max-line-mib 64)" \
  --input "$D/no_line_end.txt" --output "$D/bad/x"
rm -f "$D/no_line_end.txt"
{ echo '{"text": "first"}'; echo '{"text": "second"}'
  printf '{"text": "'; head -c $((20 * 1024 * 1024)) /dev/zero | tr '\0' 'a'; echo '"}'
  echo '{"text": "after"}'; } > "$D/huge_line.jsonl"
expect_error "$D/huge_line.jsonl:3: line longer than 8388608 bytes (--max-line-mib 8)" \
  --input "$D/huge_line.jsonl" --output "$D/bad/x" --max-line-mib 8 --workers 2
# a line of exactly the limit is read, one byte more is not
{ head -c $((1024 * 1024)) /dev/zero | tr '\0' 'b'; echo; echo short; } > "$D/exact.txt"
"$MEGATRAIN" data build --input "$D/exact.txt" --output "$D/exact" --max-line-mib 1 > "$D/log.txt" ||
  fail "a line of exactly 1 MiB was refused with --max-line-mib 1"
grep -q "documents: 2" "$D/log.txt" || fail "exact: $(cat "$D/log.txt")"
{ echo short; head -c $((1024 * 1024 + 1)) /dev/zero | tr '\0' 'b'; echo; } > "$D/over.txt"
expect_error "$D/over.txt:2: line longer than 1048576 bytes (--max-line-mib 1): each line must be one document of plain \
text or one JSON object, and a file without line ends cannot be read; a longer document needs a larger --max-line-mib" \
  --input "$D/over.txt" --output "$D/bad/x" --max-line-mib 1

# --- truncated JSONL; the first error in input order, whatever the workers ----
head -c $(( $(size "$D/many.jsonl") - 7 )) "$D/many.jsonl" > "$D/truncated.jsonl"
last=$(wc -l < "$D/many.jsonl")
for w in 1 4; do
  expect_error "$D/truncated.jsonl:$last: bad JSON: column" --input "$D/truncated.jsonl" --output "$D/bad/x" --workers $w
  grep -qF "(the file ends inside this line: truncated?)" "$D/err.txt" || fail "truncated: $(cat "$D/err.txt")"
done
{ head -n 30000 "$D/many.jsonl"; echo '{"text": "no end}'; sed -n '30001,$p' "$D/many.jsonl"
  printf '{"text": "'; head -c $((3 * 1024 * 1024)) /dev/zero | tr '\0' 'c'; echo '"}'; } > "$D/two_errors.jsonl"
for w in 1 2 5; do
  expect_error "$D/two_errors.jsonl:30001: bad JSON" --input "$D/two_errors.jsonl" --output "$D/bad/x" --workers $w --max-line-mib 2
done

# --- SIGINT and SIGKILL in the middle of a large build ------------------------
# ~200 MB of JSONL (a tokenizer.json tokenizer, one worker: several seconds);
# the signal goes once more than 1 MB of tokens is written.
{ yes '{"text": "Training large language models needs data: tokens, documents and a tokenizer. 2024-11-24"}' ||
  true; } | head -c $((200 * 1024 * 1024)) > "$D/large.jsonl"   # yes ends by SIGPIPE
mkdir -p "$D/kill"
start_build() { # start_build PREFIX [ARGS...]: sets pid once the temporary .bin holds more than 1 MB
  "$MEGATRAIN" data build --input "$D/large.jsonl" --output "$1" --tokenizer "$FIX/llama2" --workers 1 "${@:2}" \
    > /dev/null 2> "$D/kill.err" &
  pid=$!
  local tmp
  for _ in $(seq 1 600); do
    tmp=$(compgen -G "$1.bin.tmp.*" || true)
    [[ -n "$tmp" && $(size "$tmp" 2> /dev/null || echo 0) -gt 1000000 ]] && return 0
    kill -0 "$pid" 2> /dev/null || fail "the build into $1 ended before it could be stopped: $(cat "$D/kill.err")"
    sleep 0.05
  done
  fail "the build into $1 did not start: $(cat "$D/kill.err")"
}
stop_build() { kill -"$1" "$pid"; status=0; { wait "$pid" || status=$?; } 2> /dev/null; }
start_build "$D/kill/int"
stop_build INT
[[ $status -eq 130 ]] || fail "SIGINT: exit status $status, expected 130 (killed by SIGINT after cleaning up)"
grep -q "stopped by SIGINT at line [0-9]* of $D/large.jsonl; nothing written under $D/kill/int" "$D/kill.err" ||
  fail "SIGINT: no message: $(cat "$D/kill.err")"
only_files "$D/kill" || fail "SIGINT left files: $(ls -A "$D/kill")"
start_build "$D/kill/x"
stop_build KILL
[[ ! -e "$D/kill/x.idx" && ! -e "$D/kill/x.bin" ]] || fail "SIGKILL left a dataset that looks complete: $(ls -A "$D/kill")"
compgen -G "$D/kill/x.bin.tmp.*" > /dev/null || fail "SIGKILL: the build was not midway (no temporary .bin)"
cp "$D/w/many.txt.byte.1.bin" "$D/kill/old.bin"; cp "$D/w/many.txt.byte.1.idx" "$D/kill/old.idx"
start_build "$D/kill/old" --overwrite
stop_build KILL
cmp -s "$D/kill/old.bin" "$D/w/many.txt.byte.1.bin" && cmp -s "$D/kill/old.idx" "$D/w/many.txt.byte.1.idx" ||
  fail "an --overwrite build killed midway changed the old dataset"
"$MEGATRAIN" data inspect "$D/kill/old" > /dev/null || fail "the old dataset no longer opens"
rm -f "$D/large.jsonl"

# --- progress ------------------------------------------------------------------
# on a terminal (script gives the build a pty): redrawn lines with the rates
cat "$D/many.jsonl" "$D/many.jsonl" "$D/many.jsonl" "$D/many.jsonl" > "$D/progress.jsonl"   # ~28 MB: over a second
script -qec "'$MEGATRAIN' data build --input '$D/progress.jsonl' --output '$D/progress' --tokenizer '$FIX/llama2' --workers 1" \
  /dev/null > "$D/tty.txt" < /dev/null || fail "the build on a terminal failed: $(tail -c 500 "$D/tty.txt")"
grep -aq "data build: [0-9]* documents, [0-9.]* MB read ([0-9.]*%), [0-9]* tokens; [0-9.]* MB/s, [0-9.]* M tokens/s" \
  "$D/tty.txt" || fail "no progress line on a terminal: $(tail -c 500 "$D/tty.txt")"
grep -aq "documents: " "$D/tty.txt" || fail "no summary after the progress line"
# not a terminal: a short build writes nothing on stderr
"$MEGATRAIN" data build --input "$D/many.txt" --output "$D/quiet" > /dev/null 2> "$D/err.txt"
[[ ! -s "$D/err.txt" ]] || fail "stderr of a short build is not empty: $(cat "$D/err.txt")"

# --- options -------------------------------------------------------------------
for bad in "--workers 0" "--workers two" "--workers 257" "--max-line-mib 0" "--max-line-mib 1025"; do
  set +e; "$MEGATRAIN" data build --input "$D/many.txt" --output "$D/bad/x" $bad 2> "$D/err.txt"; rc=$?; set -e
  [[ $rc -eq 2 ]] || fail "$bad: exit $rc, expected 2"
  grep -q "expected a whole number" "$D/err.txt" || fail "$bad: $(cat "$D/err.txt")"
done
# (to a file first: grep -q on a pipe may exit before the writer ends, and pipefail would see its SIGPIPE)
"$MEGATRAIN" data build --help > "$WORK/help.txt" || fail "--help failed"
grep -q -- "--workers N  *threads that tokenize" "$WORK/help.txt" || fail "--help does not list --workers"
grep -q -- "--max-line-mib N" "$WORK/help.txt" || fail "--help does not list --max-line-mib"
echo "data build at scale: ok"
