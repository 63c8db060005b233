# Writes the seed corpus of the IDX fuzz target (tests/fuzz/corpus/idx/): small MNIST-format
# files, raw and gzipped, valid and with the defects the reader must refuse.
# Usage: .venv/bin/python tests/fuzz/make_idx_corpus.py
import gzip
import pathlib
import struct

out = pathlib.Path(__file__).resolve().parent / "corpus" / "idx"
out.mkdir(parents=True, exist_ok=True)


def idx(magic, dims, values):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + bytes(values)


images = idx(0x803, [2, 3, 3], range(18))
labels = idx(0x801, [5], [0, 1, 2, 3, 4])
seeds = {
    "images": images,
    "labels": labels,
    "images.gz": gzip.compress(images, mtime=0),
    "labels.gz": gzip.compress(labels, mtime=0),
    "truncated_images": images[:-4],
    "trailing_labels": labels + b"\0\0",
    "huge_header": idx(0x803, [100000, 1000, 1000], range(8)),
    "zero_dim": idx(0x803, [0, 28, 28], []),
    "bomb_labels.gz": gzip.compress(labels + bytes(1 << 16), mtime=0),
    "cut_stream.gz": gzip.compress(images, mtime=0)[:-6],
}
for name, data in seeds.items():
    (out / name).write_bytes(data)
print(f"wrote {len(seeds)} seeds to {out}")
