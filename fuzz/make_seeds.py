#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into OUT/<target>/ (small, valid or nearly valid
inputs; libFuzzer mutates from there). Deterministic, stdlib only.

usage: make_seeds.py OUT
"""
import json
import os
import struct
import sys

out = sys.argv[1]


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def safetensors(tensors, metadata=None, pad=True):
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("fuzz_safetensors", "two_tensors", safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4)),
                                                   ("b", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40")]))
put("fuzz_safetensors", "metadata", safetensors([("w", "F16", [1], b"\x00\x3c")], {"format": "pt"}))
put("fuzz_safetensors", "all_dtypes", safetensors([
    ("f64", "F64", [1], struct.pack("<d", 1.0)), ("i8", "I8", [2], b"\x01\xff"), ("u8", "U8", [1], b"\x07"),
    ("i32", "I32", [1], struct.pack("<i", -3)), ("i64", "I64", [1], struct.pack("<q", 9)),
    ("empty", "F32", [0, 3], b"")]))
put("fuzz_safetensors", "unpadded", safetensors([("x", "F32", [1], f32(7))], pad=False))

put("fuzz_index", "ok", json.dumps({"metadata": {"total_size": 20}, "weight_map": {
    "a.weight": "model-00001-of-00002.safetensors", "b.bias": "model-00002-of-00002.safetensors"}}))
put("fuzz_index", "missing_shard", json.dumps({"weight_map": {"a.weight": "model-00003-of-00003.safetensors"}}))

base_m1 = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 64, "state_size": 16,
           "num_hidden_layers": 2, "vocab_size": 512, "expand": 2, "conv_kernel": 4, "time_step_rank": "auto",
           "use_bias": False, "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
put("fuzz_config", "mamba", json.dumps(base_m1))
put("fuzz_config", "falcon_mamba", json.dumps(dict(base_m1, model_type="falcon_mamba",
                                                   architectures=["FalconMambaForCausalLM"], mixer_rms_eps=1e-6)))
base_m2 = {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 64, "num_heads": 8,
           "head_dim": 16, "state_size": 16, "n_groups": 2, "num_hidden_layers": 2, "vocab_size": 512,
           "chunk_size": 16, "expand": 2, "conv_kernel": 4, "tie_word_embeddings": False}
put("fuzz_config", "mamba2", json.dumps(base_m2))
put("fuzz_config", "mamba2_inf", json.dumps(base_m2).replace('"chunk_size": 16', '"chunk_size": 16, "time_step_limit": [0.0, Infinity]'))
# Every family's test-size config from the checkpoint tool (hybrid families included).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
sys.dont_write_bytecode = True
import make_test_checkpoint  # noqa: E402
for preset, make in sorted(make_test_checkpoint.PRESETS.items()):
    if preset.endswith("-tiny"):
        put("fuzz_config", "preset_" + preset, json.dumps(make()))

# A tiny byte-level BPE tokenizer in both merge spellings, plus added tokens and a template.
byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["\u0120", "\u010a"]
vocab = {c: i for i, c in enumerate(byte_chars)}
vocab.update({"he": len(vocab), "ll": len(vocab) + 1, "hell": len(vocab) + 2, "\u0120w": len(vocab) + 3})
tok = {"version": "1.0", "added_tokens": [{"id": 200, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                                           "rstrip": False, "normalized": False, "special": True}],
       "normalizer": {"type": "NFC"},
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "vocab": vocab,
                 "merges": ["h e", "l l", "he ll", "\u0120 w"]}}
put("fuzz_tokenizer_load", "bytelevel", json.dumps(tok))
tok2 = json.loads(json.dumps(tok))
tok2["model"]["merges"] = [["h", "e"], ["l", "l"], ["he", "ll"], ["\u0120", "w"]]
tok2["model"]["ignore_merges"] = True
tok2["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
tok2["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                                     {"Sequence": {"id": "A", "type_id": 0}}],
                          "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [200],
                                                                            "tokens": ["<|endoftext|>"]}}}
put("fuzz_tokenizer_load", "split_template", json.dumps(tok2))
# SentencePiece-style (Llama-2 form): byte_fallback BPE, Prepend/Replace normalizers, the decoder
# chain; and the Metaspace form of the same vocabulary.
sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
sp_vocab.update({"<0x%02X>" % b: 3 + b for b in range(256)})
for piece in ["\u2581", "H", "e", "l", "o", "w", "r", "d", "\u2581H", "ll", "\u2581w", "or", "\u2581Hell", "\u2581Hello"]:
    sp_vocab[piece] = len(sp_vocab)
sp = {"version": "1.0", "added_tokens": [{"id": i, "content": c, "special": True, "normalized": False}
                                          for i, c in enumerate(["<unk>", "<s>", "</s>"])],
      "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                         {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
      "pre_tokenizer": None,
      "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                  {"Sequence": {"id": "A", "type_id": 0}}],
                         "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
      "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                   {"type": "ByteFallback"}, {"type": "Fuse"},
                                                   {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True, "vocab": sp_vocab,
                "merges": ["\u2581 H", "l l", "\u2581 w", "o r", "\u2581H e", "\u2581He ll", "\u2581Hell o"]}}
sp_vocab["\u2581He"] = len(sp_vocab)
put("fuzz_tokenizer_load", "sentencepiece_llama2", json.dumps(sp))
sp2 = json.loads(json.dumps(sp))
sp2["normalizer"] = None
sp2["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
sp2["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
put("fuzz_tokenizer_load", "sentencepiece_metaspace", json.dumps(sp2))

texts = ["Hello world", "  leading and   multiple spaces\n\n\ttabs", "caf\u00e9 cafe\u0301 na\u00efve",
         "\U0001F468\u200D\U0001F469\u200D\U0001F467 family", "def f(x):\n    return x**2  # square\n",
         "12345678901234567890", "DON'T I'll we've", "<|endoftext|>mid<|begin_of_text|>", "\u4f60\u597d\u4e16\u754c",
         "\u0645\u0631\u062d\u0628\u0627", "bad utf8 \xff\xfe end"]
for i, t in enumerate(texts):
    raw = t.encode("utf-8", "surrogateescape") if "\xff" not in t else t.encode("latin-1", "replace")
    put("fuzz_tokenizer_encode", "neox%02d" % i, b"\x00" + raw)
    put("fuzz_tokenizer_encode", "llama%02d" % i, b"\x01" + raw)
    put("fuzz_tokenizer_encode", "llama2_%02d" % i, b"\x02" + raw)
    put("fuzz_tokenizer_encode", "mistral%02d" % i, b"\x03" + raw)
put("fuzz_decode", "ids", struct.pack("<8i", 9906, 1917, 128000, 0, 255, 220, 11, 30))
put("fuzz_decode", "partial_utf8", struct.pack("<3i", 9468, 232, 253))  # byte-level pieces of multi-byte chars
put("fuzz_npy", "shapes", bytes([2, 3, 4]))
put("fuzz_npy", "scalar", bytes([0]))
put("fuzz_npy", "negative", bytes([3, 2, 0xff, 1]))
requests = [
    {"model": "m", "prompt": "Hello", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "stop": ["\n", "END"],
     "n": 2, "logprobs": 3, "seed": 42, "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": [1, 2, 3], "echo": True, "presence_penalty": 1.5, "frequency_penalty": -0.5, "top_k": 40, "min_p": 0.1},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                         "function": {"name": "f", "arguments": "{}"}}]},
                  {"role": "tool", "content": "42", "tool_call_id": "c"}],
     "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 5, "tools": [{"type": "function",
                                                                                 "function": {"name": "f"}}]},
    {"prompt": ["one"], "max_tokens": 5.0, "repetition_penalty": 1.1, "ignore_eos": True, "response_format": {"type": "text"}},
]
for i, r in enumerate(requests):
    put("fuzz_request", "request%d" % i, json.dumps(r))
put("fuzz_request", "broken", '{"prompt": "x", "max_tokens": ')
# Chat templates: the real ones (tests/data/chat_templates), the feature template of the
# cross-check, and short snippets of each construct.
here = os.path.dirname(os.path.abspath(__file__))
for d in [os.path.join(here, "..", "tests", "data", "chat_templates"), os.path.join(here, "..", "tests", "chat")]:
    for name in sorted(os.listdir(d)):
        if name.endswith(".jinja"):
            with open(os.path.join(d, name), "rb") as f:
                put("fuzz_template", name[:-len(".jinja")], f.read())
snippets = [
    "{% for m in messages %}{{ loop.index0 }}{{ m.role | upper }}{% else %}none{% endfor %}",
    "{%- set ns = namespace(x=0) -%}{%- for m in messages[::-1] if m.content -%}{%- set ns.x = ns.x + 1 -%}{%- endfor -%}{{ ns.x }}",
    "{% macro f(a, b='x') %}{{ a ~ b }}{% endmacro %}{{ f(1) }}{{ f(*[1, 2]) }}",
    "{{ tools | tojson(indent=2) }}{{ messages[2].tool_calls | map(attribute='function') | list | tojson }}",
    "{{ 'a,b'.split(',') | join('|') }}{{ ' x '.strip() }}{{ 'x' if n is number else 'y' }}{{ f // 1 }}{{ n ** 3 % 7 }}",
    "{% set s %}{{ bos_token }}{% endset %}{{ s | length }}{{ range(n) | list }}{{ strftime_now('%Y-%m-%d') }}",
    "{% if nothing is none and not undefined_name is defined %}{{ raise_exception('bad ' ~ n) }}{% endif %}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}{{ {'a': [1, {'b': none}]} }}",
]
for i, t in enumerate(snippets):
    put("fuzz_template", "snippet%02d" % i, t)
print("seeds written to", out)
