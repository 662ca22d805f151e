#!/usr/bin/env bash
# test_convert_expert_bias.sh: `megatrain convert --drop-expert-bias` of MoE
# checkpoints trained with model.moe.load_balancing: expert_bias (the tiny
# qwen3_moe and mixtral recipes, 10 steps at lr 1e-2, the biases moving 0.02 a step),
# which transformers' Qwen3-MoE and Mixtral cannot hold. Needs torch and
# transformers (tests/python_env.sh, as test_convert_transformers.sh).
#   - convert --help lists the option; without it convert exits 1 naming it, and writes nothing; the
#     option on a checkpoint without biases, or toward a checkpoint, is refused;
#   - with it the export loads in transformers with no missing, unexpected or
#     mismatched weight, and computes the trained model but for the biases:
#     the biases (read from the checkpoint's files here) put back into
#     transformers' routers for the top-k choice give the loss `megatrain
#     eval` gives the checkpoint on a document (relative error < 1e-6), and
#     without them another loss (> 1e-5 off: the routing changed on that
#     document; its share of changed top-k choices is printed); the export
#     converted back to a checkpoint (no biases: as zeroed) evaluates to
#     transformers' loss without them (< 1e-6);
#   - the warning's numbers: for each MoE layer, the bias spread and the top-k
#     choices that change on the probes (every token's embedding through the
#     layer's router), recomputed here in torch from the exported weights and
#     the biases: the same counts, but for choices whose scores tie within
#     1e-5 (fp32 products in another order).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need_python torch
export MEGATRAIN PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=1
demo_data "$WORK/english"
# one document of 107 tokens (the byte tokenizer: 106 bytes + the end of document), one sample of all of it
printf 'Mixture of experts models route every token to a few experts: a router scores them, and the best ones win.\n' \
  > "$WORK/doc.txt"
"$MEGATRAIN" data build --input "$WORK/doc.txt" --output "$WORK/doc" > /dev/null
seq_len=$(wc -c < "$WORK/doc.txt")
"$MEGATRAIN" convert --help | grep -q -- "--drop-expert-bias" || fail "convert --help does not list --drop-expert-bias"

cat > "$WORK/check.py" <<'EOF'
import math, re, struct, subprocess, sys, torch, transformers as tf
tf.utils.logging.disable_progress_bar()
ckpt, hf, back_loss, ours_loss, warning, doc = sys.argv[1:7]
DOC = list(open(doc, "rb").read())
SAMPLE = DOC + DOC[:1]  # the eval sample: seq_len + 1 tokens of the repeated document

def read_tensor(ckpt, name):
    """A tensor of a megatrain checkpoint (docs/checkpoints.md, format version 1), as float32."""
    data = open(f"{ckpt}/metadata.mtck", "rb").read()
    assert data[:8] == b"MTCKPT\n\0", "not a megatrain checkpoint"
    _, _, body = struct.unpack_from("<IIQ", data, 8)
    pos, end, files, found = 24, 24 + body, [], None
    def string(p):
        n, = struct.unpack_from("<I", data, p)
        return data[p + 4:p + 4 + n].decode(), p + 4 + n
    while pos < end:
        tag, (length,) = data[pos:pos + 4], struct.unpack_from("<Q", data, pos + 4)
        p = pos + 12
        if tag == b"FILE":
            count, = struct.unpack_from("<I", data, p); p += 4
            for _ in range(count):
                n, p = string(p); _, p = string(p); p += 12
                files.append(n)
        elif tag == b"TENS":
            count, = struct.unpack_from("<I", data, p); p += 4
            for _ in range(count):
                n, p = string(p); dtype, p = string(p)
                ndim, = struct.unpack_from("<I", data, p); p += 4
                shape = struct.unpack_from(f"<{ndim}q", data, p); p += 8 * ndim
                chunks, = struct.unpack_from("<I", data, p); p += 4
                parts = []
                for _ in range(chunks):
                    f, offset, stored, raw, _ = struct.unpack_from("<IQQQI", data, p); p += 32
                    _, p = string(p); filt, p = string(p); p += 16 * ndim
                    parts.append((f, offset, stored, raw, filt))
                if n == name:
                    assert dtype == "fp32" and len(parts) == 1, f"{name}: {dtype}, {len(parts)} chunks"
                    found = parts[0], shape
        pos += 12 + length
    assert found, f"{ckpt}: no tensor {name}"
    (f, offset, stored, raw, filt), shape = found
    with open(f"{ckpt}/{files[f]}", "rb") as shard:
        shard.seek(offset)
        frame = shard.read(stored)
    out = subprocess.run(["zstd", "-dc"], input=frame, capture_output=True, check=True).stdout
    assert len(out) == raw, f"{name}: {len(out)} bytes decoded, {raw} recorded"
    if filt == "shuffle4":  # byte planes back into words
        out = bytes(b for word in zip(*(out[i * (raw // 4):(i + 1) * (raw // 4)] for i in range(4))) for b in word)
    return torch.frombuffer(bytearray(out), dtype=torch.float32).reshape(shape)

def loss_of(model):
    ids = torch.tensor([SAMPLE])
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).item()

def rel(a, b):
    return abs(a - b) / abs(b)

model, info = tf.AutoModelForCausalLM.from_pretrained(hf, output_loading_info=True)
model.eval()
bad = {k: v for k, v in info.items() if v}
assert not bad, f"loading info {bad}"
routers = {int(n.split(".")[2]): m for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")}
biases = {l: read_tensor(ckpt, f"layers.{l}.mlp.router.expert_bias") for l in routers}
assert all(b.abs().max() > 0 for b in biases.values()), "the biases did not move: the test shows nothing"

chosen = {}  # (layer, biased) -> the top-k experts of the last forward
def route(router, layer, bias):
    """transformers' router, choosing by score + bias when bias is given (megatrain's expert_bias routing)."""
    def forward(hidden_states):
        h = hidden_states.reshape(-1, router.hidden_dim)
        logits = torch.nn.functional.linear(h, router.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        _, idx = torch.topk(probs if bias is None else probs + bias, router.top_k, dim=-1)
        value = probs.gather(-1, idx)
        if getattr(router, "norm_topk_prob", True):
            value = value / value.sum(dim=-1, keepdim=True)
        chosen[layer, bias is not None] = idx
        return logits, value.to(logits.dtype), idx
    return forward

plain = loss_of(model)
for l, r in routers.items():
    r.forward = route(r, l, None)
assert loss_of(model) == plain, "the patched router without biases is not transformers' own"
for l, r in routers.items():
    r.forward = route(r, l, biases[l])
biased = loss_of(model)
ours, back = float(ours_loss), float(back_loss)
# (fp32 sums in other orders: 7e-8 seen; the biases' effect on the loss: 3e-5 and 1.3e-3)
assert rel(biased, ours) < 1e-6, f"with the biases put back: loss {biased}, megatrain eval of the checkpoint {ours}"
assert rel(plain, ours) > 1e-5, f"without the biases the loss {plain} is the checkpoint's {ours}: nothing changed"
assert rel(back, plain) < 1e-6, f"the export converted back: megatrain eval {back}, transformers {plain}"
# the share of top-k choices on the document's tokens that dropping the biases changes (the real one, printed)
for l, r in routers.items():
    r.forward = route(r, l, None)
loss_of(model)
moved = total = 0
for l in routers:
    a, b = chosen[l, False], chosen[l, True]
    moved += sum(len(set(x.tolist()) - set(y.tolist())) for x, y in zip(a, b))
    total += a.numel()
assert moved > 0, "no top-k choice of the document changed without the biases"

# the warning's per-layer numbers, recomputed on the probes (every token's embedding: vocab_size 256)
text = open(warning).read()
emb = model.get_input_embeddings().weight.detach()
cfg = model.config
k, E = cfg.num_experts_per_tok, biases[0].numel()
layers = dict(model.named_modules())
for l, r in routers.items():
    m = re.search(rf"layer {l}: biases span ([0-9.e-]+) .* without them (\d+) of the (\d+) top-{k} choices change "
                  rf"\([0-9.]+%\), on (\d+) of the (\d+) probes", text)
    assert m, f"no line for layer {l} in: {text}"
    spread, changed, choices, probes_moved, probes = float(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5])
    bias = biases[l]
    assert abs(spread - (bias.max() - bias.min()).item()) <= 1e-3 * spread, f"layer {l}: spread {spread}"
    norm = layers[f"model.layers.{l}.post_attention_layernorm"].weight.detach()
    x = emb.double()
    r_ = (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[1] + cfg.rms_norm_eps)).float()
    logits = ((emb * r_) * norm) @ r.weight.detach().T
    scores = torch.softmax(logits.double(), dim=-1).float().double()
    want = want_moved = ties = 0
    for s in scores:
        def top(v):  # ties to the lower expert, as megatrain
            return sorted(range(E), key=lambda e: (-v[e].item(), e))[:k]
        a, b = top(s), top(s + bias.double())
        d = len(set(b) - set(a))
        want, want_moved = want + d, want_moved + (d > 0)
        for v in (s, s + bias.double()):  # a choice at fp32 rounding's mercy
            order = sorted(v.tolist(), reverse=True)
            ties += order[k - 1] - order[k] < 1e-5
    assert probes == emb.shape[0] and choices == probes * k, f"layer {l}: {probes} probes, {choices} choices"
    assert abs(changed - want) <= ties and abs(probes_moved - want_moved) <= ties, \
        f"layer {l}: the warning says {changed} choices on {probes_moved} probes, recomputed {want} on {want_moved}"
    print(f"  layer {l}: bias spread {spread:.4g}; {changed} of {choices} top-{k} choices change on the probes "
          f"({want} recomputed, {ties} near ties)")
print(f"loss with the biases put back {biased:.6f} = megatrain's {ours:.6f}; without them {plain:.6f} "
      f"(= the export back in megatrain {back:.6f}); on the document {moved} of {total} top-{k} choices change "
      f"({100 * moved / total:.1f}%)")
EOF

for family in qwen3_moe mixtral; do
  run="$WORK/$family.run"
  "$MEGATRAIN" run "$REPO/recipes/tiny/$family.yaml" --set run.dir="$run" --set train.steps=10 \
    --set optimizer.lr=1.0e-2 --set train.seq_len=32 --set train.micro_batch_size=2 \
    --set "train.batch_schedule=[{step: 0, global_batch_size: 4}]" --set optimizer.schedule.warmup_steps=0 \
    --set train.eval_interval=0 \
    --set "data.train=[{path: $WORK/english, weight: 1.0}]" --set model.moe.load_balancing=expert_bias \
    --set model.moe.bias_update_rate=0.02 > "$WORK/$family.run.log" 2>&1 \
    || fail "$family: the run failed: $(tail -n 3 "$WORK/$family.run.log")"
  grep -qF "exports its checkpoints only with --drop-expert-bias" "$WORK/$family.run.log" \
    || fail "$family: the run does not say how its checkpoints export: $(grep warning "$WORK/$family.run.log")"
  ckpt="$run/checkpoints/iter_0000010"

  # without the option: refused, naming it, nothing written
  rc=0; "$MEGATRAIN" convert "$run" "$WORK/$family.refused" > "$WORK/refused.log" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] && grep -qF "model.moe.load_balancing: expert_bias routing has no transformers counterpart" \
    "$WORK/refused.log" && grep -qF -- "--drop-expert-bias exports the model without the biases" "$WORK/refused.log" \
    || fail "$family: convert without --drop-expert-bias (exit $rc): $(cat "$WORK/refused.log")"
  [[ ! -e "$WORK/$family.refused" ]] || fail "$family: a refused convert left $WORK/$family.refused"

  "$MEGATRAIN" convert "$run" "$WORK/$family.hf" --drop-expert-bias > "$WORK/$family.out" 2> "$WORK/$family.warning" \
    || fail "$family: convert --drop-expert-bias: $(cat "$WORK/$family.warning")"
  grep -qF "warning: --drop-expert-bias: $ckpt's routers chose their experts with expert biases" \
    "$WORK/$family.warning" \
    && grep -q "of the top-2 choices change" "$WORK/$family.warning" \
    || fail "$family: no warning of what dropping the biases changes: $(cat "$WORK/$family.warning")"
  grep -qF "without its expert biases (16 parameters left out)" "$WORK/$family.out" \
    || fail "$family: the summary line: $(cat "$WORK/$family.out")"
  # the export, back in megatrain (a checkpoint without biases), and the trained checkpoint with them
  "$MEGATRAIN" convert "$WORK/$family.hf" "$WORK/$family.back" > /dev/null 2>&1
  ev() { "$MEGATRAIN" eval "$1" --data "$WORK/doc" --seq-len "$seq_len" --micro-batch-size 1 --batches 1 --json \
           2> /dev/null | "$PY" -c 'import json, sys; print(repr(json.load(sys.stdin)["loss"]))'; }
  "$PY" "$WORK/check.py" "$ckpt" "$WORK/$family.hf" "$(ev "$WORK/$family.back")" "$(ev "$ckpt")" \
    "$WORK/$family.warning" "$WORK/doc.txt" > "$WORK/$family.check.log" 2>&1 \
    || fail "$family: $(tail -n 5 "$WORK/$family.check.log")"
  echo "$family:"; cat "$WORK/$family.check.log"
done

# the option where it has nothing to do: a checkpoint without biases, and toward a checkpoint
rc=0; "$MEGATRAIN" convert "$WORK/qwen3_moe.back" "$WORK/x.hf" --drop-expert-bias > "$WORK/x.log" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qF -- "--drop-expert-bias: $WORK/qwen3_moe.back has no expert biases" "$WORK/x.log" \
  || fail "--drop-expert-bias on a checkpoint without biases (exit $rc): $(cat "$WORK/x.log")"
rc=0; "$MEGATRAIN" convert "$WORK/qwen3_moe.hf" "$WORK/x.ckpt" --drop-expert-bias > "$WORK/x.log" 2>&1 || rc=$?
[[ $rc -eq 2 && ! -e "$WORK/x.hf" && ! -e "$WORK/x.ckpt" ]] \
  && grep -qF -- "--drop-expert-bias apply to megatrain -> Hugging Face only" "$WORK/x.log" \
  || fail "--drop-expert-bias toward a checkpoint (exit $rc): $(cat "$WORK/x.log")"
echo "refused: without --drop-expert-bias (naming it), with it on a model without biases or toward a checkpoint"
