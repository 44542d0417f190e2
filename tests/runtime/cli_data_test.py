"""Training data from the CLI: `train-tokenizer` (a byte-level BPE that our tokenizer and the
JavaScript reference @huggingface/tokenizers load and agree on, id for id) and `prepare-data`
(flat token files and their index), with their errors."""
import json
import os
import subprocess

from cli_common import check, data, expect_error, finish, run, scratch, start

start()
here = os.path.dirname(os.path.abspath(__file__))
hf_encode = os.path.join(here, "..", "tokenizer", "hf_encode.mjs")
with open(os.path.join(data, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
    shakespeare = f.read()
corpus = os.path.join(scratch, "shakespeare_slice.txt")
with open(corpus, "w", encoding="utf-8") as f:
    f.write(shakespeare[:200_000])


def tokenize(tok_dir, text):
    rc, out, err = run("tokenize", "-m", tok_dir, "-p", text)
    return json.loads(out) if rc == 0 else f"rc={rc} {err.strip()}"


def decode(tok_dir, ids):
    rc, out, err = run("tokenize", "-m", tok_dir, "--decode", json.dumps(ids))
    return out[:-1] if rc == 0 and out.endswith("\n") else f"rc={rc} {err.strip()}"


# train-tokenizer: vocab 600 on 200 kB of Shakespeare.
tok = os.path.join(scratch, "tok")
rc, out, err = run("train-tokenizer", "-i", corpus, "--vocab-size", "600", "-o", tok)
vocab = {}
if rc == 0:
    with open(os.path.join(tok, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
check("train-tokenizer writes tokenizer.json with 600 tokens", rc == 0 and len(vocab) == 600 and
      len(tj["model"]["merges"]) == 600 - 257, f"rc={rc} {err}")
check("train-tokenizer reports words, merges and time on stderr",
      rc == 0 and "words" in err and "343 merges" in err and " s)" in err, err)
check("the special token is id 0, an added token marked special",
      vocab.get("<|endoftext|>") == 0 and tj["added_tokens"][0]["special"] is True if vocab else False)
check("pre-tokenizer, decoder and post-processor are ByteLevel",
      vocab and [tj[k]["type"] for k in ("pre_tokenizer", "decoder", "post_processor")] == ["ByteLevel"] * 3 and
      tj["pre_tokenizer"]["add_prefix_space"] is False and tj["pre_tokenizer"]["use_regex"] is True)

# Ours and the JavaScript reference agree id for id, and decode round-trips.
cases = ["Hello world", "First Citizen:\nBefore we proceed any further, hear me speak.",
         "  leading and trailing spaces  ", "tabs\tand\n\n\nnewlines \n \n", "ünïcödé naïve café 日本語 🎉 ∑x²",
         "<|endoftext|>", "end of one<|endoftext|>start of the next", "it's we'll they're 12345 3.14159",
         "", " ", "\u00a0non-breaking\u2028line sep", shakespeare[5000:7000]]
cases_file = os.path.join(scratch, "cases.json")
with open(cases_file, "w", encoding="utf-8") as f:
    json.dump(cases, f)
p = subprocess.run(["node", hf_encode, tok, cases_file], capture_output=True, text=True, timeout=120)
check("the JavaScript reference loads the trained tokenizer", p.returncode == 0, p.stderr.strip())
ref = json.loads(p.stdout) if p.returncode == 0 else [{"ids": None, "decoded": None}] * len(cases)
for text, r in zip(cases, ref):
    ours = tokenize(tok, text)
    check(f"ids equal the reference's for {text[:40]!r}", ours == r["ids"], f"ours {ours} ref {r['ids']}")
    check(f"decode round-trips {text[:40]!r}", decode(tok, ours) == text == r["decoded"] if isinstance(ours, list)
          else False, f"{decode(tok, ours)!r}")
check("the special token in text is one token", tokenize(tok, "a<|endoftext|>b")[1:2] == [0])

# Training is deterministic.
tok2 = os.path.join(scratch, "tok2")
rc, _, _ = run("train-tokenizer", "-i", corpus, "--vocab-size", "600", "-o", tok2)
same = rc == 0 and open(os.path.join(tok, "tokenizer.json"), "rb").read() == \
    open(os.path.join(tok2, "tokenizer.json"), "rb").read()
check("training twice writes the same tokenizer.json", same)

# --min-frequency stops early; --special-tokens sets several (ids 0, 1, ...).
tok3 = os.path.join(scratch, "tok3")
tiny = os.path.join(scratch, "tiny.txt")
with open(tiny, "w") as f:
    f.write("abc abc abd\n")
rc, out, err = run("train-tokenizer", "-i", tiny, "--vocab-size", "1000", "-o", tok3, "--min-frequency", "2",
                   "--special-tokens", "<s>", "</s>")
with open(os.path.join(tok3, "tokenizer.json"), encoding="utf-8") as f:
    t3 = json.load(f) if rc == 0 else {}
check("--min-frequency stops when no pair is frequent enough", rc == 0 and "stopped early" in err and
      len(t3["model"]["vocab"]) < 1000, err)
check("--special-tokens gives ids 0, 1 in order", rc == 0 and t3["model"]["vocab"]["<s>"] == 0 and
      t3["model"]["vocab"]["</s>"] == 1 and len(t3["added_tokens"]) == 2)

# Errors: one line, exit 1.
missing = os.path.join(scratch, "missing.txt")
expect_error("train-tokenizer: missing input file", ["train-tokenizer", "-i", missing, "--vocab-size", "300", "-o",
             os.path.join(scratch, "x")], 1, f"{missing}: no such file")
expect_error("train-tokenizer: vocab size below 256 + specials", ["train-tokenizer", "-i", corpus, "--vocab-size",
             "256", "-o", os.path.join(scratch, "x")], 1, "--vocab-size 256: must be >= 257")
empty = os.path.join(scratch, "empty.txt")
open(empty, "w").close()
expect_error("train-tokenizer: empty input", ["train-tokenizer", "-i", empty, "--vocab-size", "300", "-o",
             os.path.join(scratch, "x")], 1, "no text to train on")
blocker = os.path.join(scratch, "a_file")
with open(blocker, "w") as f:
    f.write("x")
expect_error("train-tokenizer: unwritable output directory", ["train-tokenizer", "-i", corpus, "--vocab-size", "300",
             "-o", os.path.join(blocker, "sub")], 1, "cannot create the output directory")

# prepare-data: one document (a file) -> its tokens, as `tokenize` gives them, then EOS; the last
# --val-fraction of them held out.
import hashlib
import math
import struct


def read_bin(path, dtype):
    raw = open(path, "rb").read()
    width = {"uint16": 2, "uint32": 4}[dtype]
    return list(struct.unpack("<" + {"uint16": "H", "uint32": "I"}[dtype] * (len(raw) // width), raw))


def prepare(out_name, tokenizer, inputs, *extra):
    out_dir = os.path.join(scratch, out_name)
    rc, out, err = run("prepare-data", "--tokenizer", tokenizer, "-i", *inputs, "-o", out_dir, *extra)
    index = json.load(open(os.path.join(out_dir, "index.json"))) if rc == 0 else None
    if index is None:
        return rc, err, None, [], []
    train = read_bin(os.path.join(out_dir, "train.bin"), index["dtype"])
    val = read_bin(os.path.join(out_dir, "val.bin"), index["dtype"])
    return rc, err, index, train, val


doc_text = shakespeare[:60_000]
doc = os.path.join(scratch, "doc.txt")
with open(doc, "w", encoding="utf-8") as f:
    f.write(doc_text)
expected = tokenize(tok, doc_text) + [0]
rc, err, index, train, val = prepare("data1", tok, [doc])
check("prepare-data of one document succeeds and reports counts", rc == 0 and "1 documents" in err and
      f"{len(expected)} tokens" in err, err)
check("one document: train then val are tokenize's ids followed by EOS", train + val == expected,
      f"{len(train)}+{len(val)} vs {len(expected)}")
check("one document: val is the last ceil(0.1 * tokens)", len(val) == math.ceil(0.1 * len(expected)), len(val))
check("index.json: counts, dtype uint16, eos, vocab", index and index["dtype"] == "uint16" and
      index["train"]["tokens"] == len(train) and index["val"]["tokens"] == len(val) and index["eos_id"] == 0 and
      index["vocab_size"] == 600 and index["val"]["documents"][0]["document_offset"] == len(train))
tok_json = os.path.join(tok, "tokenizer.json")
check("index.json: the tokenizer's sha256 and path",
      index and index["tokenizer"]["sha256"] == hashlib.sha256(open(tok_json, "rb").read()).hexdigest() and
      os.path.samefile(index["tokenizer"]["path"], tok_json))
check("train.bin is 2 bytes a token", os.path.getsize(os.path.join(scratch, "data1", "train.bin")) == 2 * len(train))

# Several documents: whole documents held out, each one's tokens in place as the index says.
texts = [shakespeare[i * 3000:(i + 1) * 3000] for i in range(6)]
docs = []
for i, t in enumerate(texts):
    docs.append(os.path.join(scratch, f"doc{i}.txt"))
    with open(docs[-1], "w", encoding="utf-8") as f:
        f.write(t)
rc, err, index, train, val = prepare("data6", tok, docs, "--val-fraction", "0.3", "--seed", "7")
per_doc = {d: tokenize(tok, t) + [0] for d, t in zip(docs, texts)}
ok = index is not None
for split, ids in [("train", train), ("val", val)] if ok else []:
    for e in index[split]["documents"]:
        ok = ok and ids[e["offset"]:e["offset"] + e["tokens"]] == per_doc[e["source"]] and e["document_offset"] == 0
sources = sorted(e["source"] for s in ("train", "val") for e in index[s]["documents"]) if index else []
check("several documents: each is whole in train or val where the index says", ok and sources == sorted(docs))
total = sum(len(v) for v in per_doc.values())
check("several documents: val holds >= 30% of tokens, train the rest", index and len(train) + len(val) == total and
      len(val) >= 0.3 * total and index["val"]["documents"] and index["train"]["documents"], err)
rc2, _, index2, train2, val2 = prepare("data6b", tok, docs, "--val-fraction", "0.3", "--seed", "7")
check("the same seed gives the same split", index2 and train2 == train and val2 == val)
rc, err, index, train, val = prepare("data6c", tok, docs, "--val-fraction", "0")
check("--val-fraction 0: everything is train, val.bin is empty", rc == 0 and len(train) == total and val == [], err)

# dtype: uint16 for GPT-NeoX (50k tokens), uint32 for Llama 3 (128k).
for name, dtype in [("gpt-neox-20b", "uint16"), ("llama3", "uint32")]:
    tdir = os.path.join(data, "tokenizers", name)
    rc, err, index, train, val = prepare(f"data_{name}", tdir, [docs[0]], "--val-fraction", "0")
    ids = tokenize(tdir, texts[0])
    eos = index["eos_id"] if index else None
    if eos is not None and ids[-1:] != [eos]:
        ids = ids + [eos]
    check(f"{name}: dtype {dtype}, tokens as tokenize gives them", index and index["dtype"] == dtype and train == ids,
          err)

# Errors: one line, exit 1.
x = os.path.join(scratch, "x")
expect_error("prepare-data: missing input", ["prepare-data", "--tokenizer", tok, "-i", missing, "-o", x], 1,
             f"{missing}: no such file")
binary = os.path.join(scratch, "b.bin")
with open(binary, "wb") as f:
    f.write(b"abc\x00\x01\x02")
expect_error("prepare-data: binary input", ["prepare-data", "--tokenizer", tok, "-i", binary, "-o", x], 1,
             "not a text file (a NUL byte at offset 3)")
expect_error("prepare-data: empty result", ["prepare-data", "--tokenizer", tok, "-i", empty, "-o", x], 1,
             "no tokens: the input files are empty")
expect_error("prepare-data: no tokenizer there", ["prepare-data", "--tokenizer", scratch, "-i", doc, "-o", x], 1,
             "no tokenizer.json there")
expect_error("prepare-data: --val-fraction 1", ["prepare-data", "--tokenizer", tok, "-i", doc, "-o", x,
             "--val-fraction", "1"], 1, "--val-fraction 1: must be in [0, 1)")

finish()
