#!/usr/bin/env python3
"""Converts a BERT-family sentence-embedding model (a Hugging Face directory: config.json,
model.safetensors, tokenizer.json) to OpenVINO IR, the format OpenVINO Model Server and
openvino-genai's TextEmbeddingPipeline load:

    OUT/openvino_model.xml|.bin          inputs input_ids, attention_mask, token_type_ids
                                         (i64, [batch, tokens]); output last_hidden_state
    OUT/openvino_tokenizer.xml|.bin      from openvino-tokenizers
    OUT/openvino_detokenizer.xml|.bin
    OUT/config.json, tokenizer files     copied, so max_position_embeddings and the like are
                                         read as OVMS reads them

Why not `optimum-cli export openvino`: it is the vendor's converter and gives the same
graph, but its install pulls torch with CUDA (6 GB here); this builds the same encoder with
OpenVINO's own graph API from the weights (numpy, no torch), in seconds. With optimum
installed, `optimum-cli export openvino --model DIR --task feature-extraction OUT` makes an
equivalent directory that the test server loads the same way.

Usage: convert.py MODEL_DIR OUT_DIR
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from safetensors.numpy import load_file


def linear(x, weights, prefix):
    """x @ W^T + b, as torch.nn.Linear stores W ([out, in])."""
    w = ops.constant(weights[f"{prefix}.weight"])
    b = ops.constant(weights[f"{prefix}.bias"])
    return ops.add(ops.matmul(x, w, transpose_a=False, transpose_b=True), b)


def layer_norm(x, weights, prefix, eps):
    """LayerNorm over the hidden axis: MVN (variance inside the square root, as torch)."""
    axes = ops.constant(np.array([-1], dtype=np.int64))
    normed = ops.mvn(x, axes, normalize_variance=True, eps=eps, eps_mode="inside_sqrt")
    gamma = ops.constant(weights[f"{prefix}.weight"])
    beta = ops.constant(weights[f"{prefix}.bias"])
    return ops.add(ops.multiply(normed, gamma), beta)


def gelu(x):
    """BERT's "gelu" is the exact (erf) form, not the tanh approximation."""
    return ops.gelu(x, approximation_mode="erf")


def build_encoder(config, weights):
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    eps = float(config.get("layer_norm_eps", 1e-12))
    if config.get("model_type") not in ("bert",):
        raise SystemExit(f"model_type {config.get('model_type')!r}: only BERT encoders are built here")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit("only absolute position embeddings are built here")
    if config.get("hidden_act", "gelu") != "gelu":
        raise SystemExit(f"hidden_act {config.get('hidden_act')!r}: only gelu is built here")

    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    token_type_ids = ops.parameter([-1, -1], ov.Type.i64, name="token_type_ids")
    for p, name in ((input_ids, "input_ids"), (attention_mask, "attention_mask"), (token_type_ids, "token_type_ids")):
        p.output(0).set_names({name})

    zero = ops.constant(np.array(0, dtype=np.int64))
    one = ops.constant(np.array(1, dtype=np.int64))
    words = ops.gather(ops.constant(weights["embeddings.word_embeddings.weight"]), input_ids, zero)
    # Positions 0..seq_len-1 for every row.
    seq_len = ops.gather(ops.shape_of(input_ids, output_type="i64"), one, zero)
    positions = ops.range(zero, seq_len, one, output_type="i64")
    pos = ops.gather(ops.constant(weights["embeddings.position_embeddings.weight"]), positions, zero)
    types = ops.gather(ops.constant(weights["embeddings.token_type_embeddings.weight"]), token_type_ids, zero)
    x = ops.add(ops.add(words, types), pos)
    x = layer_norm(x, weights, "embeddings.LayerNorm", eps)

    # Additive mask, [batch, 1, 1, tokens]: 0 where attended, the float minimum where padded
    # (as transformers builds it).
    mask = ops.convert(attention_mask, "f32")
    mask = ops.unsqueeze(mask, ops.constant(np.array([1, 2], dtype=np.int64)))
    minimum = ops.constant(np.array(np.finfo(np.float32).min, dtype=np.float32))
    mask = ops.multiply(ops.subtract(ops.constant(np.array(1.0, dtype=np.float32)), mask), minimum)

    split_heads = ops.constant(np.array([0, 0, heads, head_dim], dtype=np.int64))
    merge_heads = ops.constant(np.array([0, 0, hidden], dtype=np.int64))
    to_heads = ops.constant(np.array([0, 2, 1, 3], dtype=np.int64))
    scale = ops.constant(np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))

    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def heads_of(t):
            return ops.transpose(ops.reshape(t, split_heads, special_zero=True), to_heads)

        q = heads_of(linear(x, weights, f"{p}.attention.self.query"))
        k = heads_of(linear(x, weights, f"{p}.attention.self.key"))
        v = heads_of(linear(x, weights, f"{p}.attention.self.value"))
        context = ops.scaled_dot_product_attention(q, k, v, mask, scale, causal=False)
        context = ops.reshape(ops.transpose(context, to_heads), merge_heads, special_zero=True)
        attended = linear(context, weights, f"{p}.attention.output.dense")
        x = layer_norm(ops.add(attended, x), weights, f"{p}.attention.output.LayerNorm", eps)
        inner = gelu(linear(x, weights, f"{p}.intermediate.dense"))
        out = linear(inner, weights, f"{p}.output.dense")
        x = layer_norm(ops.add(out, x), weights, f"{p}.output.LayerNorm", eps)

    result = ops.result(x)
    result.output(0).get_tensor().set_names({"last_hidden_state"})
    return ov.Model([result], [input_ids, attention_mask, token_type_ids], "bert_encoder")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    model_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((model_dir / "config.json").read_text())
    weights = {k: v.astype(np.float32) if v.dtype != np.int64 else v
               for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    # Checkpoints saved by BertModel carry no "bert." prefix; those saved by task heads do.
    if not any(k.startswith("embeddings.") for k in weights):
        weights = {k.removeprefix("bert."): v for k, v in weights.items()}

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ov.save_model(build_encoder(config, weights), tmp / "openvino_model.xml", compress_to_fp16=False)

    # The tokenizer as OpenVINO models (what OVMS and TextEmbeddingPipeline run), converted
    # from the Hugging Face tokenizer; transformers is needed for that, torch is not.
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer, detokenizer = convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer, tmp / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, tmp / "openvino_detokenizer.xml")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt", "sentence_bert_config.json", "modules.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, tmp / name)
    if (model_dir / "1_Pooling").is_dir():
        shutil.copytree(model_dir / "1_Pooling", tmp / "1_Pooling")
    # Only a complete directory takes the final name, so an interrupted conversion is
    # never loaded as a model.
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    print(f"converted {model_dir} -> {out_dir}")


if __name__ == "__main__":
    main()
