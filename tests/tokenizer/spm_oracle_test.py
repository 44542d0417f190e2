"""SentencePiece tokenizer.model files against Debian's python3-sentencepiece, the oracle.

On the Mistral v1 and v3 models (tests/data/tokenizers/mistral-v1, mistral-v3: directories with
only tokenizer.model), for the texts of cases.json and cases_sentencepiece.json and some
Shakespeare, through tokenize_dump: our ids equal BOS + the oracle's ids, our decode of them
equals the oracle's; on random id sequences (heavy on byte pieces and control pieces) our decode
and our StreamDecoder, fed one id at a time, equal the oracle's decode. Then `hybridlm tokenize`
on such a directory. In a build without libsentencepiece (HAVE_SPM=OFF: the aarch64 cross build)
both must refuse the directory with exactly "this build has no SentencePiece support".

usage: spm_oracle_test.py <tokenize_dump> <hybridlm> <tests/data> <HAVE_SPM: ON or OFF>
"""
import json
import os
import random
import subprocess
import sys
import tempfile

if len(sys.argv) != 5:
    sys.exit("usage: spm_oracle_test.py <tokenize_dump> <hybridlm> <tests/data> <ON|OFF>")
dump_tool, hybridlm, data, have_spm = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "ON"
here = os.path.dirname(os.path.abspath(__file__))
models = {name: os.path.join(data, "tokenizers", name) for name in ("mistral-v1", "mistral-v3")}
failures = 0


def check(what, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else ": " + detail))
    failures += 0 if ok else 1


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True, encoding="utf-8")
    return p.returncode, p.stdout, p.stderr


for name, d in models.items():
    if not os.path.isfile(os.path.join(d, "tokenizer.model")) or os.path.exists(os.path.join(d, "tokenizer.json")):
        sys.exit(f"spm_oracle_test: FAIL: {d} must hold tokenizer.model and no tokenizer.json (tests/data)")

if not have_spm:
    message = "this build has no SentencePiece support"
    for name, d in models.items():
        rc, out, err = run(dump_tool, d, os.path.join(here, "cases_sentencepiece.json"))
        check(f"{name}: tokenize_dump refuses tokenizer.model in one line", rc == 1 and message in err and
              err.count("\n") == 1, f"rc={rc} {err!r}")
        rc, out, err = run(hybridlm, "tokenize", "-m", d, "-p", "Hello")
        check(f"{name}: hybridlm tokenize refuses tokenizer.model in one line", rc != 0 and message in err and
              err.strip().count("\n") == 0, f"rc={rc} {err!r}")
    sys.exit(1 if failures else 0)

try:
    import sentencepiece
except ImportError as e:
    sys.exit(f"spm_oracle_test: FAIL: python3-sentencepiece is missing ({e}); scripts/setup.sh installs it")

cases = []
for f in ("cases.json", "cases_sentencepiece.json"):
    with open(os.path.join(here, f), encoding="utf-8") as fh:
        cases += json.load(fh)
with open(os.path.join(data, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as fh:
    lines = fh.read().split("\n")
cases += ["\n".join(lines[:300])] + [lines[i] for i in (0, 1, 9, 33, 100, 150)]
# Python can hand the oracle only text that is valid UTF-8 (no lone surrogates).
cases = [c for c in cases if not any(0xD800 <= ord(ch) <= 0xDFFF for ch in c)]

tmp = tempfile.mkdtemp(prefix="spmcmp-")
cases_file = os.path.join(tmp, "cases.json")
with open(cases_file, "w", encoding="utf-8") as fh:
    json.dump(cases, fh)


def show(s):
    return json.dumps(s[:200] + ("…" if len(s) > 200 else ""), ensure_ascii=False)


for name, d in models.items():
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    rc, out, err = run(dump_tool, d, cases_file)
    if rc != 0:
        check(f"{name}: tokenize_dump runs", False, err.strip())
        continue
    ours = json.loads(out)
    bad = []
    for text, got in zip(cases, ours):
        want = [sp.bos_id()] + sp.encode(text)
        if got["ids"] != want:
            k = next((i for i, (a, b) in enumerate(zip(want, got["ids"])) if a != b), min(len(want), len(got["ids"])))
            bad.append(f"{show(text)}: first difference at {k}: oracle {want[max(0, k - 2):k + 4]} "
                       f"{[sp.id_to_piece(i) for i in want[max(0, k - 2):k + 4]]}, ours {got['ids'][max(0, k - 2):k + 4]}")
        elif got["decoded_ids"] != sp.decode(want):
            bad.append(f"{show(text)}: decode {show(got['decoded_ids'])}, oracle {show(sp.decode(want))}")
    check(f"{name}: {len(cases)} texts: ids (BOS + oracle's) and decode identical to python3-sentencepiece",
          not bad, f"{len(bad)} differ; first: {bad[:1]}")

    # Random id sequences: byte pieces, control pieces (<s>, </s>, [INST] ...), "▁" and any piece.
    rng = random.Random(7)
    n = sp.get_piece_size()
    byte_ids = [i for i in range(n) if sp.is_byte(i)]
    control_ids = [i for i in range(n) if sp.is_control(i)]
    space_ids = [i for i in range(n) if set(sp.id_to_piece(i)) == {"\u2581"}]
    id_lists = []
    for _ in range(400):
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            pool = byte_ids if r < 0.5 else control_ids if r < 0.6 else space_ids if r < 0.7 else range(n)
            ids.append(rng.choice(pool))
        id_lists.append(ids)
    # A character in byte pieces split across pushes, alone and after a word.
    zhong = [sp.piece_to_id(f"<0x{b:02X}>") for b in "中".encode()]
    id_lists += [zhong, [sp.piece_to_id("\u2581Hello")] + zhong, [sp.bos_id()] + zhong + zhong[:2]]
    ids_file = os.path.join(tmp, f"{name}_ids.json")
    with open(ids_file, "w") as fh:
        json.dump(id_lists, fh)
    rc, out, err = run(dump_tool, "--decode", d, ids_file)
    if rc != 0:
        check(f"{name}: tokenize_dump --decode runs", False, err.strip())
        continue
    bad = []
    for ids, got in zip(id_lists, json.loads(out)):
        want = sp.decode(ids)
        want_skip = sp.decode([i for i in ids if not sp.is_control(i)])
        for what, g, w in (("decode", got["decoded"], want), ("stream", got["streamed"], want),
                           ("decode (skip special)", got["decoded_skip"], want_skip),
                           ("stream (skip special)", got["streamed_skip"], want_skip)):
            if g != w:
                bad.append(f"{what} of {ids} = {show(g)}, oracle {show(w)}")
    check(f"{name}: {len(id_lists)} random id sequences: decode and stream identical to python3-sentencepiece",
          not bad, f"{len(bad)} differ; first: {bad[:1]}")

    # The CLI on a directory with only tokenizer.model.
    text = "Hello world! 中文 😀"
    rc, out, err = run(hybridlm, "tokenize", "-m", d, "-p", text)
    want = [sp.bos_id()] + sp.encode(text)
    check(f"{name}: hybridlm tokenize -p gives BOS + the oracle's ids", rc == 0 and json.loads(out) == want,
          f"rc={rc} out={out!r} err={err!r} want={want}")
    rc, out, err = run(hybridlm, "tokenize", "-m", d, "--decode", json.dumps(want))
    check(f"{name}: hybridlm tokenize --decode gives the oracle's decode", rc == 0 and out == sp.decode(want) + "\n",
          f"rc={rc} out={out!r} err={err!r}")

sys.exit(1 if failures else 0)
