"""Byte corpora for study C: enwik8 and TinyStories, real or embedded.

Why: the paper trains on enwik8 (primary) and TinyStories. Neither can be downloaded on the project's machines,
so the real download-and-verify code is kept (tested on local fixtures) and the smoke scale uses an *embedded*
corpus for each: text generated deterministically from a fixed seed with the same surface form (wiki XML pages;
`<|endoftext|>`-separated children's stories). Every table that uses an embedded corpus labels it `embedded`.

Sources (docs/sources.md, section "Study C"):
  enwik8       http://mattmahoney.net/dc/enwik8.zip, 100,000,000 bytes, MD5 a1fa5ffddb56f4953e226637dabbb36a,
               standard split 90M train / 5M val / 5M test.
  TinyStories  roneneldan/TinyStories, TinyStoriesV2-GPT4-train.txt and -valid.txt; stories separated by
               `<|endoftext|>`. No checksum is published: we check that the file is non-empty UTF-8 text with the
               separator. train file -> train split; valid file -> val (first half of its stories) and test.

`source: file` (`prepare_file`) takes any byte file, e.g. the user's own text. It cannot go wrong silently: a zip (of
exactly one file), gzip, xz or bz2 file is recognised by its magic bytes and unpacked, as `source: path` unpacks
enwik8.zip (a tar, zstd or 7z file is refused, naming the format); a text that is not mostly printable ASCII or UTF-8
gets a warning stating the fraction (`check_text`); an MD5 mismatch names the key to set and both MD5s.

Prepared splits are raw byte files `<out>/{train,val,test}.bin` plus `meta.json` (source, sizes, md5).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import logging
import lzma
import random
import re
import shutil
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json, read_json
from gradfidelity.studies.local.config import Corpora, CorpusConfig

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_SIZE = 100_000_000
ENWIK8_MD5 = "a1fa5ffddb56f4953e226637dabbb36a"
ENWIK8_SPLIT = (90_000_000, 5_000_000, 5_000_000)
TINYSTORIES_BASE = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
TINYSTORIES_FILES = {"train": "TinyStoriesV2-GPT4-train.txt", "valid": "TinyStoriesV2-GPT4-valid.txt"}
EOT = "<|endoftext|>"
SPLITS = ("train", "val", "test")

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- utilities
def md5_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path) -> Path:
    """Stream url (http(s):// or file://) to dest atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f, length=1 << 22)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not download {url} to {dest}: {e}") from e
    tmp.replace(dest)
    return dest


def verify(path: Path, size: int, md5: str) -> None:
    """Size first (cheap), then MD5; the error names the file."""
    actual = path.stat().st_size
    if actual != size:
        raise UserError(f"{path}: size {actual} bytes, expected {size} (corrupt or wrong file)")
    digest = md5_of(path)
    if digest != md5:
        raise UserError(f"{path}: MD5 {digest}, expected {md5} (corrupt or wrong file)")


# Compressed formats by their magic bytes: the ones the standard library unpacks, and the ones refused (zstd needs
# Python 3.14's compression.zstd, 7z a third-party package; a tar holds several files, not one text).
_UNPACKED = {"zip": (b"PK\x03\x04", b"PK\x05\x06"), "gzip": (b"\x1f\x8b\x08",), "xz": (b"\xfd7zXZ\x00",)}
_REFUSED = {"zstd": b"\x28\xb5\x2f\xfd", "7z": b"7z\xbc\xaf\x27\x1c"}
_BZ2 = re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")  # stream header + first block (or end-of-stream) magic


def archive_format(path: Path) -> str | None:
    """'zip', 'gzip', 'xz', 'bz2', 'zstd' or '7z' by the file's first bytes (not its name); None for anything else."""
    with open(path, "rb") as f:
        head = f.read(16)
    for fmt, magics in _UNPACKED.items():
        if head.startswith(magics):
            return fmt
    if _BZ2.match(head):
        return "bz2"
    return next((fmt for fmt, magic in _REFUSED.items() if head.startswith(magic)), None)


@contextlib.contextmanager
def open_unpacked(path: Path, fmt: str, member: str | None = None) -> Iterator[BinaryIO]:
    """The unpacked bytes of `path` (`fmt` from `archive_format`: zip, gzip, xz or bz2) as a binary stream. A zip
    gives its member `member`, or, when `member` is None, its one file (none or several: a UserError naming the
    path and the members)."""
    if fmt == "zip":
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if member is None:
                files = [n for n in names if not n.endswith("/")]  # folder entries hold no bytes
                if len(files) != 1:
                    raise UserError(f"{path}: a zip must hold exactly one file to be used as a corpus; it holds "
                                    f"{len(files)}: {files[:10]}{' ...' if len(files) > 10 else ''} (unzip it and "
                                    f"point the path at the one text file)")
                member = files[0]
            elif member not in names:
                raise UserError(f"{path}: zip has no member '{member}' (members: {names[:5]})")
            with z.open(member) as f:
                yield f
    else:
        opener = {"gzip": gzip.open, "xz": lzma.open, "bz2": bz2.open}.get(fmt)
        if opener is None:
            raise UserError(f"{path}: cannot unpack a {fmt} file here")
        with opener(path, "rb") as f:
            yield f


def read_unpacked(path: Path, fmt: str) -> bytes:
    """All the bytes of the archive `path` unpacked (a zip: its one file); a damaged archive is a UserError
    naming the path and the format."""
    try:
        with open_unpacked(path, fmt) as f:
            return f.read()
    except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile, zlib.error) as e:
        raise UserError(f"{path}: looks like a {fmt} file (by its first bytes) but cannot be unpacked: {e}") from e


# Text check of `source: file`: the share of sampled bytes that are neither printable ASCII (with tab, newline, CR)
# nor part of a valid UTF-8 multi-byte character. Real text scores 0 (the Python documentation, UTF-8 prose with
# accents); random bytes about 55%.
NON_TEXT_WARN = 0.05
_SAMPLE_CHUNK, _SAMPLE_CHUNKS = 1 << 14, 64
# after decoding with surrogateescape: ASCII controls other than tab/newline/CR, DEL, and the undecodable bytes
_NON_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\udc80-\udcff]")


def _char_start(blob: bytes, i: int) -> int:
    """`i`, moved past at most 3 UTF-8 continuation bytes: a sample chunk does not cut a character of real text."""
    j = i
    while j < min(i + 3, len(blob)) and 0x80 <= blob[j] < 0xC0:
        j += 1
    return j


def non_text_fraction(blob: bytes) -> tuple[float, int]:
    """(fraction of non-text bytes, sample size): the whole blob up to 1 MiB, else 64 evenly spaced chunks of about
    16 KiB (each starting and ending on a UTF-8 character boundary)."""
    if len(blob) <= _SAMPLE_CHUNK * _SAMPLE_CHUNKS:
        chunks = [blob]
    else:
        step = (len(blob) - _SAMPLE_CHUNK) // (_SAMPLE_CHUNKS - 1)
        chunks = [blob[_char_start(blob, i * step):_char_start(blob, i * step + _SAMPLE_CHUNK)]
                  for i in range(_SAMPLE_CHUNKS)]
    n = sum(len(c) for c in chunks)
    bad = sum(len(_NON_TEXT.findall(c.decode("utf-8", errors="surrogateescape"))) for c in chunks)
    return (bad / n if n else 0.0), n


def check_text(blob: bytes, path: Path, key: str) -> float:
    """Warn (logging, to stderr in the job's log) when more than 5% of a sample of `blob` is not text; returns the
    fraction. A warning, not an error: a byte-level model trains on any bytes, and no config key could override a
    refusal; the fraction is also recorded in meta.json (`non_text_fraction`)."""
    frac, n = non_text_fraction(blob)
    if frac > NON_TEXT_WARN:
        log.warning("WARNING: %s: %s does not look like text: %.1f%% of a %d-byte sample is neither printable ASCII "
                    "(with tab, newline, CR) nor UTF-8 (more than %.0f%%). Training goes ahead on these bytes; if "
                    "this is not the file you meant, check %s.path.", key, path, 100 * frac, n, 100 * NON_TEXT_WARN,
                    key)
    return frac


def _write_splits(out: Path, parts: dict[str, bytes], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, blob in parts.items():
        tmp = out / f"{name}.bin.part"
        tmp.write_bytes(blob)
        tmp.replace(out / f"{name}.bin")
    # Each split's size and MD5, checked by load_split before any training reads it (a damaged or truncated
    # split must fail loudly, not train on what is left).
    atomic_write_json(out / "meta.json", {**meta, "sizes": {k: len(v) for k, v in parts.items()},
                                          "split_md5": {k: hashlib.md5(v, usedforsecurity=False).hexdigest()
                                                        for k, v in parts.items()}})


# ----------------------------------------------------------------------------------------------- enwik8
def prepare_enwik8(out: Path, local: Path | None = None) -> None:
    """Download (or take `local`: the enwik8 file or its zip), verify size + MD5 of the unzipped file,
    and write the standard contiguous split. The module constants are read at call time (tests patch them)."""
    url, size, md5, split = ENWIK8_URL, ENWIK8_SIZE, ENWIK8_MD5, ENWIK8_SPLIT
    raw = out / "enwik8"
    if local is not None:
        if not local.exists():
            raise UserError(f"local.enwik8.path: {local} does not exist")
        src = local
    else:
        src = download(url, out / "enwik8.zip")
    if zipfile.is_zipfile(src):
        with open_unpacked(src, "zip", member="enwik8") as fin:
            out.mkdir(parents=True, exist_ok=True)
            with open(raw, "wb") as fout:
                shutil.copyfileobj(fin, fout, length=1 << 22)
        data_path = raw
    else:
        data_path = src
    verify(data_path, size, md5)
    blob = data_path.read_bytes()
    a, b, c = split
    if a + b + c != len(blob):
        raise UserError(f"split {split} does not add up to the {len(blob)} bytes of {data_path}")
    _write_splits(out, {"train": blob[:a], "val": blob[a:a + b], "test": blob[a + b:]},
                  {"corpus": "enwik8", "source": "download" if local is None else f"path:{local}", "md5": md5})
    if raw.exists() and local is None:
        raw.unlink()  # the splits hold the same bytes


# ----------------------------------------------------------------------------------------------- TinyStories
def _check_stories(path: Path) -> bytes:
    if not path.exists():
        raise UserError(f"{path} does not exist")
    blob = path.read_bytes()
    if not blob:
        raise UserError(f"{path} is empty")
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text: {e}") from e
    if EOT.encode() not in blob:
        raise UserError(f"{path} has no '{EOT}' separator: not a TinyStoriesV2 file")
    return blob


def prepare_tinystories(out: Path, local_dir: Path | None = None) -> None:
    """train file -> train; valid file -> val (first half of the stories) + test (second half)."""
    base_url = TINYSTORIES_BASE
    paths = {}
    for key, name in TINYSTORIES_FILES.items():
        if local_dir is not None:
            paths[key] = local_dir / name
        else:
            paths[key] = download(base_url + name, out / name)
    train = _check_stories(paths["train"])
    stories = _check_stories(paths["valid"]).split(EOT.encode())
    half = len(stories) // 2
    val, test = EOT.encode().join(stories[:half]), EOT.encode().join(stories[half:])
    _write_splits(out, {"train": train, "val": val, "test": test},
                  {"corpus": "tinystories", "source": "download" if local_dir is None else f"path:{local_dir}",
                   "md5": {k: md5_of(p) for k, p in paths.items()}})


# ----------------------------------------------------------------------------------------------- embedded
_SYLL = ["ka", "ri", "to", "ne", "sa", "mo", "lu", "de", "vi", "an", "or", "el", "is", "um", "ta", "ber",
         "gen", "ist", "ion", "ter", "al", "com", "pro", "ci", "ty", "ment", "hal", "ro", "wen", "dar"]


def _lexicon(rng: random.Random, n: int) -> list[str]:
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(_SYLL) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    return sorted(words)


def embedded_enwik8(n_bytes: int, seed: int = 8) -> bytes:
    """Wiki-XML-like pages: titles, [[links]], numbers, a Zipf lexicon and a sticky bigram chain, so the text
    has both local structure (markup, spelling) and longer-range structure (page topic words recur)."""
    rng = random.Random(seed)
    lex = _lexicon(rng, 3000)
    weights = [1.0 / (i + 1) for i in range(len(lex))]
    follow = {w: rng.choices(lex, weights, k=6) for w in lex}  # each word's favourite successors
    parts: list[str] = []
    size = 0
    page = 0
    while size < n_bytes:
        topic = rng.choices(lex, weights, k=5)
        title = " ".join(t.capitalize() for t in topic[:2])
        body = []
        for _ in range(rng.randint(3, 9)):
            w = rng.choice(topic)
            sent = [w.capitalize()]
            for _ in range(rng.randint(5, 18)):
                r = rng.random()
                w = rng.choice(follow[w]) if r < 0.6 else (rng.choice(topic) if r < 0.75 else
                                                         rng.choices(lex, weights)[0])
                sent.append(f"[[{w}]]" if rng.random() < 0.08 else w)
            if rng.random() < 0.2:
                sent.append(f"in {rng.randint(1500, 2008)}")
            body.append(" ".join(sent) + ".")
        text = (f"  <page>\n    <title>{title}</title>\n    <id>{page}</id>\n    <text xml:space=\"preserve\">"
                f"'''{title}''' " + " ".join(body) + "\n== See also ==\n* [[" + topic[2] + "]]\n</text>\n"
                "  </page>\n")
        parts.append(text)
        size += len(text)
        page += 1
    return "".join(parts).encode()[:n_bytes]


_NAMES = ["Lily", "Tom", "Mia", "Ben", "Sue", "Max", "Anna", "Tim", "Lucy", "Sam", "Zoe", "Jack"]
_ANIMALS = ["cat", "dog", "bird", "bunny", "frog", "duck", "bear", "fish", "mouse", "puppy"]
_THINGS = ["ball", "kite", "box", "hat", "cake", "toy", "book", "flower", "boat", "car", "shell", "drum"]
_PLACES = ["park", "garden", "forest", "beach", "house", "school", "farm", "river", "hill", "shop"]
_ADJ = ["big", "small", "red", "blue", "happy", "shiny", "soft", "funny", "old", "green", "little", "kind"]
_VERBS = ["play", "run", "jump", "dance", "sing", "swim", "read", "draw", "climb", "hide"]
_FEEL = ["happy", "sad", "scared", "excited", "proud", "sorry", "surprised", "tired"]


def embedded_tinystories(n_bytes: int, seed: int = 11) -> bytes:
    """Short templated children's stories with recurring characters, separated by `<|endoftext|>`."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        name, friend = rng.sample(_NAMES, 2)
        animal, thing, place = rng.choice(_ANIMALS), rng.choice(_THINGS), rng.choice(_PLACES)
        adj, verb, feel = rng.choice(_ADJ), rng.choice(_VERBS), rng.choice(_FEEL)
        lines = [f"Once upon a time, there was a {adj} {animal} named {name}.",
                 f"{name} liked to {verb} in the {place} every day."]
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.3:
                lines.append(f"One day, {name} found a {rng.choice(_ADJ)} {thing} near the {place}.")
            elif r < 0.55:
                lines.append(f"{name} met {friend}. \"Do you want to {rng.choice(_VERBS)} with me?\" "
                             f"asked {name}. \"Yes!\" said {friend}.")
            elif r < 0.8:
                lines.append(f"The {thing} was {rng.choice(_ADJ)}, and {name} felt {rng.choice(_FEEL)}.")
            else:
                lines.append(f"{friend} and {name} went to the {rng.choice(_PLACES)} to {verb}.")
        lines.append(f"In the end, {name} was very {feel}, and they played with the {thing} all day.")
        text = " ".join(lines) + "\n" + EOT + "\n"
        out.append(text)
        size += len(text)
    return "".join(out).encode()[:n_bytes]


def prepare_embedded(corpus: str, out: Path, n_bytes: int) -> None:
    gen = {"enwik8": embedded_enwik8, "tinystories": embedded_tinystories}[corpus]
    blob = gen(n_bytes)
    a = int(0.9 * len(blob))
    b = int(0.95 * len(blob))  # the same 90/5/5 proportions as enwik8's split
    _write_splits(out, {"train": blob[:a], "val": blob[a:b], "test": blob[b:]},
                  {"corpus": corpus, "source": "embedded", "md5": hashlib.md5(blob).hexdigest()})


def prepare_file(corpus: str, path: Path, out: Path, split: tuple[float, ...] = (0.9, 0.05, 0.05),
                 md5: str = "") -> None:
    """Any byte file -> contiguous train/val/test splits by the fractions in `split` (enwik8's own 90/5/5 layout
    by default).

    `md5` (when given) is checked against the MD5 of the file *as given*, before any unpacking: for foo.txt.gz it is
    the MD5 of foo.txt.gz (what `md5sum foo.txt.gz` prints). That MD5 goes into meta.json (`md5`, with `file_bytes`).
    A zip (of exactly one file), gzip, xz or bz2 file, recognised by its magic bytes, is unpacked first, the way
    `source: path` unpacks enwik8.zip; meta.json records `unpacked` (the format, or null) and the unpacked text's
    `text_bytes` and `text_md5`. A tar, zstd or 7z file is refused. A text that is not mostly printable ASCII or
    UTF-8 gets a warning (`check_text`), its `non_text_fraction` recorded."""
    key = f"local.corpora.{corpus}"
    if not path.is_file():
        raise UserError(f"{key}.path: {path} is not a file")
    if len(split) != 3 or any(f <= 0 for f in split) or abs(sum(split) - 1.0) > 1e-9:
        raise UserError(f"{key}.split={list(split)}: three positive fractions that sum to 1")
    digest = md5_of(path)
    if md5 and digest != md5.lower():
        raise UserError(f"{key}.md5: {path} has MD5 {digest}, expected {md5}. For your own file set "
                        f"`md5: \"\"` (no check) or `md5: {digest}` under {key} in your --configfile (an `md5` set by "
                        f"the scale's config is that of its own file, and an override of `path` alone keeps it)")
    fmt = archive_format(path)
    if fmt in _REFUSED:
        raise UserError(f"{path}: a {fmt} file; {key} unpacks only zip, gzip, xz and bz2: unpack it yourself and "
                        f"set {key}.path to the text file")
    blob = read_unpacked(path, fmt) if fmt else path.read_bytes()
    if blob[257:262] == b"ustar":
        raise UserError(f"{path}: a tar archive{f' (inside the {fmt} file)' if fmt else ''}, not one text: extract "
                        f"it (tar -xf) and set {key}.path to the text file")
    if fmt:
        print(f"{path}: unpacked the {fmt} file ({path.stat().st_size} -> {len(blob)} bytes)")
    frac = check_text(blob, path, key)
    a = int(split[0] * len(blob))
    b = a + int(split[1] * len(blob))
    parts = {"train": blob[:a], "val": blob[a:b], "test": blob[b:]}
    for name, part in parts.items():
        if len(part) < 2048:
            raise UserError(f"{path}: the {name} split has {len(part)} bytes (file of {len(blob)} bytes"
                            f"{' unpacked' if fmt else ''}, split {list(split)}): too small to train or evaluate on")
    _write_splits(out, parts, {"corpus": corpus, "source": f"file:{path.name}", "md5": digest, "file": str(path),
                               "file_bytes": path.stat().st_size, "unpacked": fmt,
                               "text_bytes": len(blob), "text_md5": hashlib.md5(blob).hexdigest() if fmt else digest,
                               "non_text_fraction": round(frac, 4), "split": list(split)})


def concat_tree(root: Path, suffix: str, out: Path) -> str:
    """Every file under `root` whose name ends with `suffix`, in sorted relative-path order, joined by one newline
    into `out` (written atomically); returns its MD5. Builds a one-file corpus from a text tree such as the
    Python documentation sources of Debian's python3.11-doc (docs/sources.md, "Study C")."""
    if not root.is_dir():
        raise UserError(f"{root} is not a folder (for the cpu scale's corpus: run `make cpu-data`)")
    files = sorted(p for p in root.rglob(f"*{suffix}") if p.is_file())
    if not files:
        raise UserError(f"{root} holds no *{suffix} file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".part")
    with open(tmp, "wb") as f:
        for p in files:
            f.write(p.read_bytes().rstrip(b"\n") + b"\n")
    tmp.replace(out)
    return md5_of(out)


def concat_tree_checked(root: Path, suffix: str, out: Path, md5: str = "") -> str:
    """`concat_tree`, then its MD5 checked against `md5` when given (a mismatch removes the file): the `local-corpus`
    job."""
    digest = concat_tree(root, suffix, out)
    if md5 and digest != md5:
        out.unlink()
        raise UserError(f"{out}: MD5 {digest}, expected {md5} (another release of the package under "
                        f"{root}? see docs/sources.md, Study C)")
    print(f"{out}: MD5 {digest}")
    return digest


def prepare_configured(corpus: str, corpora: Corpora, out: Path) -> None:
    """The `local-data` job: `prepare` the corpus with its entry of local.corpora."""
    cfg = corpora.get(corpus)
    if cfg is None:
        raise UserError(f"local.corpora has no entry '{corpus}'")
    prepare(corpus, cfg, out)


def prepare(corpus: str, cfg: CorpusConfig, out: Path) -> None:
    """Split one corpus into `out` as its config says."""
    if cfg.source == "file":
        prepare_file(corpus, Path(cfg.path), out, tuple(cfg.split), cfg.md5)
    elif cfg.source == "embedded":
        prepare_embedded(corpus, out, cfg.embedded_bytes)
    elif corpus == "enwik8":
        prepare_enwik8(out, local=Path(cfg.path) if cfg.source == "path" else None)
    else:
        prepare_tinystories(out, local_dir=Path(cfg.path) if cfg.source == "path" else None)


# ----------------------------------------------------------------------------------------------- batches
def load_split(data_dir: Path, split: str) -> torch.Tensor:
    """One prepared split as uint8 bytes, after its size and MD5 are checked against meta.json."""
    path = Path(data_dir) / f"{split}.bin"
    if not path.exists():
        raise UserError(f"{path} does not exist (run the local_data rule first)")
    meta = read_json(Path(data_dir) / "meta.json")
    size, md5 = (meta.get("sizes") or {}).get(split), (meta.get("split_md5") or {}).get(split)
    remedy = f"delete {Path(data_dir)} and rerun (the local_data rule prepares it again)"
    if size is None or md5 is None:
        raise UserError(f"{Path(data_dir) / 'meta.json'} records no size or MD5 for the {split} split (prepared by "
                        f"an older version): {remedy}")
    try:
        verify(path, size, md5)
    except UserError as exc:
        raise UserError(f"{exc}; {remedy}") from None
    arr = np.fromfile(path, dtype=np.uint8)
    return torch.from_numpy(arr)


def batch_offsets(n_bytes: int, block: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """(steps, batch) start offsets: the data order. Same seed -> same order for BP and every method."""
    if n_bytes <= block + 1:
        raise UserError(f"split has {n_bytes} bytes, fewer than block_size + 1 = {block + 1}")
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, n_bytes - block - 1, (steps, batch), generator=g)


def get_batch(data: torch.Tensor, offsets: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """offsets (B,) -> x, y (B, T) int64, y shifted by one byte."""
    idx = offsets[:, None] + torch.arange(block + 1)[None, :]  # (B, T+1)
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


def eval_offsets(n_bytes: int, block: int, n_batches: int, batch: int) -> torch.Tensor:
    """Evenly spaced, non-random held-out windows: identical for every method and seed."""
    n = n_batches * batch
    starts = torch.linspace(0, n_bytes - block - 2, n).long()
    return starts.view(n_batches, batch)
