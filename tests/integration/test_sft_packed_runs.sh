#!/usr/bin/env bash
# test_sft_packed_runs.sh: the SFT recipe end to end: recipes/sft/chat.jsonl built
# with --format sft (llama3 template), trained by recipes/sft/tiny_llama_lora.yaml
# (LoRA, data.pack, train.loss per_token), the loss falling; a 3:1 blend of it
# with the same conversations built with the chatml template packs each dataset
# on its own and trains, the loss falling; the same run on
# tp 2 (+ sequence parallel), dp 2, dp 2 + ZeRO-1, tp 2 x dp 2, cp 2, cp 4,
# pp 2, pp 2 x vpp 2 (selective recompute), tp 2 x cp 2 + sp and
# pp 2 x cp 2 x dp 2 (ZeRO-1) gives the one-rank losses and grad norms, and a
# tiny qwen3_moe fully fine-tuned packed on ep 2, cp 2, pp 2 and dp 2 its own; a
# conversation longer than seq_len + 1 stops the run
# naming the document, and data.pack_overlong: truncate says how many it cut (and how many of those keep no
# counted target), once at dp 2 (rank 0 speaks for the job);
# the cuda build (when there is one) refuses data.pack on cuda.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
RECIPE="$REPO/recipes/sft/tiny_llama_lora.yaml"

"$MEGATRAIN" data build --format sft --chat-template llama3 --input "$REPO/recipes/sft/chat.jsonl" \
  --output "$WORK/chat" > /dev/null
COMMON=(--set "data.train=[{path: $WORK/chat, weight: 1.0}]" --set train.steps=8 --set logging.interval=1
        --set checkpoint.interval=0)

"$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/base" "${COMMON[@]}" > "$WORK/base.log" 2>&1 ||
  { tail -20 "$WORK/base.log"; fail "the SFT recipe failed"; }
grep -q "data: train packed 20 documents into" "$WORK/base.log" || fail "no packing line: $(head "$WORK/base.log")"
# its "% used": the positions the documents fill (a document of L tokens fills L - 1) over rows x seq_len, from the
# .idx's lengths (Megatron's header: 9 bytes of magic, version, dtype, sequence and document counts, then lengths)
used=$(python3 - "$WORK/chat.idx" "$(sed -n 's/.*packed 20 documents into \([0-9]*\) rows of \([0-9]*\) positions.*/\1 \2/p' \
  "$WORK/base.log")" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
count = struct.unpack_from("<Q", raw, 18)[0]
lengths = struct.unpack_from(f"<{count}i", raw, 34)
rows, seq = map(int, sys.argv[2].split())
print(f"{100 * sum(max(min(n, seq + 1) - 1, 0) for n in lengths) / (rows * seq):.1f}% used")
PY
)
grep -q "rows of 512 positions ($used)" "$WORK/base.log" || fail "the packing line's share is not $used: $(grep 'data:' "$WORK/base.log")"
first=$(json_field "$WORK/base/metrics.jsonl" loss | head -1)
last=$(json_field "$WORK/base/metrics.jsonl" loss | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: $first -> $last"

"$MEGATRAIN" data build --format sft --chat-template chatml --input "$REPO/recipes/sft/chat.jsonl" \
  --output "$WORK/chatml" > /dev/null
"$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/blend" "${COMMON[@]}" \
  --set "data.train=[{path: $WORK/chat, weight: 3.0}, {path: $WORK/chatml, weight: 1.0}]" > "$WORK/blend.log" 2>&1 ||
  { tail -20 "$WORK/blend.log"; fail "the packed blend failed"; }
packed="data: train packed 2 datasets, each into its own rows of 512 positions, blended by weight (the share of rows): "
packed+="data.train\[0\] $WORK/chat (weight 0.75): 20 documents into [0-9]* rows .*; "
packed+="data.train\[1\] $WORK/chatml (weight 0.25): 20 documents into [0-9]* rows"
grep -q "$packed" "$WORK/blend.log" || fail "the blend's packing line: $(grep 'data:' "$WORK/blend.log")"
grep -q "train samples (blended from 2 datasets)" "$WORK/blend.log" || fail "the blend's train line: $(grep '^train:' "$WORK/blend.log")"
first=$(json_field "$WORK/blend/metrics.jsonl" loss | head -1)
last=$(json_field "$WORK/blend/metrics.jsonl" loss | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the blend's loss did not fall: $first -> $last"
echo "packed SFT: a 3:1 blend of two datasets packs each and trains ($first -> $last)"

if command -v mpirun > /dev/null; then
  # pp 2 x vpp 2 needs 4 layers: its one-rank run is base4
  "$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/base4" "${COMMON[@]}" --set model.num_layers=4 \
    --set train.recompute=selective > "$WORK/base4.log" 2>&1 || { tail -20 "$WORK/base4.log"; fail "base4 failed"; }
  for layout in "tp2 2 base --set parallel.tp=2 --set parallel.sequence_parallel=true" "dp2 2 base" \
                "dp2zero 2 base --set parallel.distributed_optimizer=true" "tp2dp2 4 base --set parallel.tp=2" \
                "cp2 2 base --set parallel.cp=2" "cp4 4 base --set parallel.cp=4" "pp2 2 base --set parallel.pp=2" \
                "pp2vpp2 2 base4 --set parallel.pp=2 --set parallel.vpp=2 --set model.num_layers=4 --set train.recompute=selective" \
                "tp2cp2 4 base --set parallel.tp=2 --set parallel.cp=2 --set parallel.sequence_parallel=true" \
                "pp2cp2dp2 8 base --set parallel.pp=2 --set parallel.cp=2 --set parallel.distributed_optimizer=true"; do
    read -r name np base settings <<< "$layout"
    # shellcheck disable=SC2086
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" run "$RECIPE" \
      --set run.dir="$WORK/$name" "${COMMON[@]}" $settings > "$WORK/$name.log" 2>&1 ||
      { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
    for field in loss grad_norm; do
      compare $field "$WORK/$base/metrics.jsonl" "$WORK/$name/metrics.jsonl" || fail "packed $name: $field differs"
    done
  done
  echo "packed SFT: every layout above gives the one-rank losses"

  # a MoE model fully fine-tuned on packed rows: its rows' padding is routed nowhere and counted in no auxiliary
  # loss (tests/unit/test_packing.c), on every layout: ep 2, cp 2 (the padding's count summed over cp), pp 2, dp 2
  MOE=("$REPO/recipes/tiny/qwen3_moe.yaml" "${COMMON[@]}" --set data.pack=true --set train.loss=per_token
       --set train.seq_len=512 --set model.max_position_embeddings=512 --set train.micro_batch_size=2
       --set "train.batch_schedule=[{step: 0, global_batch_size: 4}]"
       --set optimizer.schedule.warmup_steps=1 --set train.eval_interval=0)
  for base in "moe" "moeseq --set model.moe.load_balancing=seq_aux_loss --set model.moe.z_loss_coeff=0.001"; do
    read -r name settings <<< "$base"
    # shellcheck disable=SC2086
    "$MEGATRAIN" run "${MOE[@]}" --set run.dir="$WORK/$name" $settings > "$WORK/$name.log" 2>&1 ||
      { tail -20 "$WORK/$name.log"; fail "$name: the run failed"; }
  done
  for layout in "moe-ep2 2 moe --set parallel.ep=2" "moe-cp2 2 moe --set parallel.cp=2" "moe-pp2 2 moe --set parallel.pp=2" \
                "moe-dp2 2 moe" "moeseq-cp2 2 moeseq --set parallel.cp=2 --set model.moe.load_balancing=seq_aux_loss \
--set model.moe.z_loss_coeff=0.001"; do
    read -r name np base settings <<< "$layout"
    # shellcheck disable=SC2086
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$MEGATRAIN" run "${MOE[@]}" \
      --set run.dir="$WORK/$name" $settings > "$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log"; fail "$name failed"; }
    for field in loss grad_norm moe_aux_loss; do
      compare $field "$WORK/$base/metrics.jsonl" "$WORK/$name/metrics.jsonl" || fail "packed $name: $field differs"
    done
  done
  echo "packed SFT of qwen3_moe: ep 2, cp 2, pp 2, dp 2 (and cp 2 with seq_aux_loss and a z-loss) give the one-rank losses"
fi

rc=0
"$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/long" "${COMMON[@]}" --set train.seq_len=128 > "$WORK/long.log" 2>&1 || rc=$?
[[ $rc -ne 0 ]] || fail "an overlong conversation was accepted"
grep -q "data.train $WORK/chat: [0-9]* documents* [a-z]* longer than train.seq_len + 1 = 129 tokens (the first, document \
[0-9]*; the longest [0-9]* tokens): packed samples are never split; raise train.seq_len to [0-9]* for all of them" \
  "$WORK/long.log" ||
  fail "overlong: $(tail -3 "$WORK/long.log")"
"$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/cut" "${COMMON[@]}" --set train.seq_len=128 \
  --set data.pack_overlong=truncate > "$WORK/cut.log" 2>&1 || fail "truncate: $(tail -3 "$WORK/cut.log")"
grep -q "documents longer than seq_len + 1 = 129 tokens were truncated to it" "$WORK/cut.log" ||
  fail "truncate does not say so: $(head "$WORK/cut.log")"
if command -v mpirun > /dev/null; then  # every rank's loader finds it; the job says it once (rank 0)
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/cut2" \
    "${COMMON[@]}" --set train.seq_len=128 --set data.pack_overlong=truncate > "$WORK/cut2.log" 2>&1 ||
    fail "truncate at dp 2: $(tail -3 "$WORK/cut2.log")"
  said=$(grep -c "documents longer than seq_len + 1 = 129 tokens were truncated to it" "$WORK/cut2.log" || true)
  [[ $said -eq 1 ]] || fail "truncate at dp 2: the warning said $said times, expected once: $(head "$WORK/cut2.log")"
fi
# Truncated documents whose kept part holds no counted target (the template's header and the user's turn fill it):
# at seq_len 128 every conversation (its first counted token is its 130th or later), whose run logs loss 0, and
# at 144 those whose first counted token lies past token 144, counted here from the .bin/.idx and the mask
# (Megatron's .idx: lengths, then the documents' byte offsets into the .bin).
grep -q "data.train (train rows): 20 of those 20 truncated documents keep no target the loss mask counts .*every step's loss will be 0" \
  "$WORK/cut.log" || fail "truncated to nothing: no warning: $(grep warning "$WORK/cut.log")"
[[ $(json_field "$WORK/cut/metrics.jsonl" loss | sort -u) == 0 ]] || fail "truncated to nothing: a loss that is not 0"
expected=$(python3 - "$WORK/chat" 144 <<'PY'
import struct, sys
def documents(prefix):
    raw = open(prefix + ".idx", "rb").read()
    count = struct.unpack_from("<Q", raw, 18)[0]
    lengths = struct.unpack_from(f"<{count}i", raw, 34)
    offsets = struct.unpack_from(f"<{count}q", raw, 34 + 4 * count)
    fmt, size = {1: ("B", 1), 3: ("h", 2), 4: ("i", 4), 8: ("H", 2)}[raw[17]]
    data = open(prefix + ".bin", "rb").read()
    return [struct.unpack_from(f"<{n}{fmt}", data, at) for n, at in zip(lengths, offsets)]
seq = int(sys.argv[2])
cut = [m for m in documents(sys.argv[1] + "_mask") if len(m) > seq + 1]
print(sum(not any(m[1:seq + 1]) for m in cut), len(cut))
PY
)
read -r empty cut <<< "$expected"
[[ $empty -gt 0 && $empty -lt $cut ]] || fail "seq_len 144 should leave some but not all truncated documents empty: $expected"
"$MEGATRAIN" run "$RECIPE" --set run.dir="$WORK/cut144" "${COMMON[@]}" --set train.seq_len=144 \
  --set data.pack_overlong=truncate > "$WORK/cut144.log" 2>&1 || fail "truncate 144: $(tail -3 "$WORK/cut144.log")"
grep -q "data.train (train rows): $empty of those $cut truncated documents keep no target the loss mask counts (.*): they train nothing;" \
  "$WORK/cut144.log" || fail "seq_len 144: expected $empty of $cut: $(grep warning "$WORK/cut144.log")"
# eval's validation rows: the same count, said of the evaluation's loss and with eval's option
"$MEGATRAIN" eval "$WORK/cut144" --data "$WORK/chat" --pack --pack-overlong truncate --seq-len 144 --batches 1 \
  > "$WORK/cut144-eval.log" 2>&1 || fail "eval truncate 144: $(tail -3 "$WORK/cut144-eval.log")"
grep -q "data.valid (valid rows): $empty of those $cut truncated documents keep no target .*: they add nothing to the evaluation's loss; a longer seq_len (train.seq_len; eval's --seq-len) keeps them" \
  "$WORK/cut144-eval.log" || fail "eval seq_len 144: $(grep warning "$WORK/cut144-eval.log")"
echo "truncated documents left with no counted target: all 20 at seq_len 128, $empty of $cut at 144"
if [[ -x "$REPO/build/cuda/megatrain" ]]; then
  MEGATRAIN="$REPO/build/cuda/megatrain" expect_refused "data.pack on cuda" \
    "data.pack: packed rows (attention restricted to each sample) are not implemented on GPUs yet" 1 \
    run "$RECIPE" --set run.dir="$WORK/cuda" "${COMMON[@]}" --set peft.type=none --set train.loss=per_micro_batch \
    --set run.device=cuda --set precision=bf16
else
  echo "no build/cuda/megatrain: the cuda refusal is not checked here"
fi
echo "PASS test_sft_packed_runs"
