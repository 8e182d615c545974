"""The corpus of scripts/scale/run.sh: every UTF-8 file (up to 1 MB) under the given roots,
one document each, dealt round-robin into 96 files, documents separated by a line holding
only a record separator (0x1e). Usage: make_corpus.py OUT_DIR ROOT..."""
import os, sys
roots = sys.argv[2:]
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
N = 96
outs = [open(os.path.join(out_dir, f"part-{i:03d}.txt"), "w", encoding="utf-8") for i in range(N)]
total = docs = 0
k = 0
for root in roots:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            try:
                if os.path.getsize(p) > 1 << 20 or os.path.islink(p):
                    continue
                text = open(p, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            if "\x1e" in text or not text.strip():
                continue
            outs[k % N].write(text)
            outs[k % N].write("\n\x1e\n")
            k += 1
            total += len(text.encode())
            docs += 1
for o in outs:
    o.close()
print(f"{docs} documents, {total/1e9:.2f} GB of text in {N} files")
