#!/usr/bin/env bash
# make_seeds.sh: rewrites the binary seed corpora of tests/fuzz/corpus
# (safetensors, indexed_dataset, ckpt_meta, ckpt_reader) from a tiny model
# and dataset made here, with build/megatrain (`make`) and python3. Run it
# after a format change; the text corpora are written by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
MEGATRAIN=${MEGATRAIN:-build/megatrain}
C=tests/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$C"/{safetensors,indexed_dataset,ckpt_meta,ckpt_reader}

# A llama of 1 layer, hidden 8, vocab 16 (tied), in safetensors with every dtype we read.
python3 - "$tmp/hf" "$C/safetensors" <<'PY'
import json, os, struct, sys
hf, out = sys.argv[1], sys.argv[2]
os.makedirs(hf, exist_ok=True)
def tensors(shapes):
    # small repeating values: zstd compresses them, so the seeds stay small
    return {n: (s, [((i * 7) % 5 - 2) * 0.125 for i in range(eval('*'.join(map(str, s)) or '1'))]) for n, s in shapes}
def encode(ts, dtype="F32", meta=None):
    header, data = {}, b""
    if meta: header["__metadata__"] = meta
    for name, (shape, values) in ts.items():
        if dtype == "F32": raw = struct.pack("<%df" % len(values), *values)
        elif dtype == "F16": raw = struct.pack("<%de" % len(values), *values)
        else: raw = b"".join(struct.pack("<f", v)[2:] for v in values)  # BF16: the high half
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data
p = "model.layers.0."
model = tensors([("model.embed_tokens.weight", [16, 8]), (p + "input_layernorm.weight", [8]),
                 (p + "self_attn.q_proj.weight", [8, 8]), (p + "self_attn.k_proj.weight", [4, 8]),
                 (p + "self_attn.v_proj.weight", [4, 8]), (p + "self_attn.o_proj.weight", [8, 8]),
                 (p + "post_attention_layernorm.weight", [8]), (p + "mlp.gate_proj.weight", [8, 8]),
                 (p + "mlp.up_proj.weight", [8, 8]), (p + "mlp.down_proj.weight", [8, 8]),
                 ("model.norm.weight", [8])])
open(os.path.join(hf, "model.safetensors"), "wb").write(encode(model, meta={"format": "pt"}))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
           "vocab_size": 16, "max_position_embeddings": 32, "rope_theta": 10000.0, "rms_norm_eps": 1e-06,
           "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32"},
          open(os.path.join(hf, "config.json"), "w"))
small = tensors([("a", [2, 3]), ("b", [4]), ("scalar", [])])
open(os.path.join(out, "f32_metadata.safetensors"), "wb").write(encode(small, "F32", {"format": "pt", "k": "v"}))
open(os.path.join(out, "bf16.safetensors"), "wb").write(encode(small, "BF16"))
open(os.path.join(out, "f16.safetensors"), "wb").write(encode(small, "F16"))
open(os.path.join(out, "empty.safetensors"), "wb").write(encode({}))
PY

# A checkpoint of that model (weights only), and the metadata of a run's checkpoint (with STAT).
"$MEGATRAIN" convert "$tmp/hf" "$tmp/ckpt" > /dev/null
cp "$tmp/ckpt/metadata.mtck" "$C/ckpt_meta/converted.mtck"
# ckpt_reader's input: u32 length of metadata.mtck, it, then its files in their listed order
python3 - "$tmp/ckpt" "$C/ckpt_reader/converted.bin" <<'PY'
import os, struct, sys
d, out = sys.argv[1], sys.argv[2]
meta = open(os.path.join(d, "metadata.mtck"), "rb").read()
body, names, at = meta[24:], [], 0
while at + 12 <= len(body):
    tag, n = body[at:at + 4], struct.unpack("<Q", body[at + 4:at + 12])[0]
    rec = body[at + 12:at + 12 + n]
    if tag == b"FILE":
        count, q = struct.unpack("<I", rec[:4])[0], 4
        for _ in range(count):
            ln = struct.unpack("<I", rec[q:q + 4])[0]; names.append(rec[q + 4:q + 4 + ln].decode()); q += 4 + ln
            ln = struct.unpack("<I", rec[q:q + 4])[0]; q += 4 + ln + 8 + 4  # role, size, crc
    at += 12 + n
files = b"".join(open(os.path.join(d, n), "rb").read() for n in names)
open(out, "wb").write(struct.pack("<I", len(meta)) + meta + files)
PY
printf 'tiny training text for a checkpoint\nsecond line\n' > "$tmp/text.txt"
"$MEGATRAIN" data build --input "$tmp/text.txt" --output "$tmp/data/text" > /dev/null
cat > "$tmp/run.yaml" <<YAML
run: {name: seed, dir: $tmp/run}
model: {family: qwen3, num_layers: 1, hidden_size: 8, intermediate_size: 8, num_attention_heads: 2,
        num_key_value_heads: 1, vocab_size: 256, max_position_embeddings: 16}
train: {steps: 1, seq_len: 8, micro_batch_size: 1, global_batch_size: 1, eval_interval: 0}
data: {train: [{path: $tmp/data/text, weight: 1}]}
logging: {tensorboard: false}
YAML
"$MEGATRAIN" run "$tmp/run.yaml" > /dev/null
cp "$tmp"/run/checkpoints/iter_0000001/metadata.mtck "$C/ckpt_meta/run_with_state.mtck"
# A LoRA run from that checkpoint: adapters only, and a BASE record referencing it.
"$MEGATRAIN" run "$tmp/run.yaml" --set run.dir="$tmp/lora" --set init_from="$tmp/run" \
  --set "peft={type: lora, rank: 2, alpha: 4}" > /dev/null
cp "$tmp"/lora/checkpoints/iter_0000001/metadata.mtck "$C/ckpt_meta/lora_base_reference.mtck"

# Indexed datasets: u32 length of PREFIX.idx, it, then PREFIX.bin (uint16 from data build; int32 and uint8 by hand).
python3 - "$tmp/data/text" "$C/indexed_dataset" <<'PY'
import os, struct, sys
prefix, out = sys.argv[1], sys.argv[2]
def pack(idx, binary): return struct.pack("<I", len(idx)) + idx + binary
idx, binary = open(prefix + ".idx", "rb").read(), open(prefix + ".bin", "rb").read()
open(os.path.join(out, "uint16_data_build.bin"), "wb").write(pack(idx, binary))
def make(dtype, size, docs):
    seqs = [s for d in docs for s in d]
    lengths, offsets, at = [], [], 0
    for s in seqs: lengths.append(len(s)); offsets.append(at); at += len(s) * size
    bounds, n = [0], 0
    for d in docs: n += len(d); bounds.append(n)
    idx = b"MMIDIDX\0\0" + struct.pack("<QB", 1, dtype) + struct.pack("<QQ", len(seqs), len(bounds))
    idx += struct.pack("<%di" % len(lengths), *lengths) + struct.pack("<%dq" % len(offsets), *offsets)
    idx += struct.pack("<%dq" % len(bounds), *bounds)
    fmt = {1: "B", 4: "i"}[dtype]
    return pack(idx, b"".join(struct.pack("<%d%s" % (len(s), fmt), *s) for s in seqs))
open(os.path.join(out, "int32_two_docs.bin"), "wb").write(make(4, 4, [[[1, 2, 3], [4]], [[70000, 5]]]))
open(os.path.join(out, "uint8_empty_seq.bin"), "wb").write(make(1, 1, [[[9, 8], []], []]))
PY
ls -l "$C"/{safetensors,indexed_dataset,ckpt_meta,ckpt_reader}
